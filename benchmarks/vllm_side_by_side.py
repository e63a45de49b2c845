"""mmrope next to vLLM's own M-RoPE position code (vLLM 0.33.0, read from its wheel; see
vllm_anchor.py) and the transformers reference: equality on generated single samples, then time.

A developer tool, not run by CI. It needs the unzipped wheel (vLLM is never installed):

    pip download vllm==0.33.0 --no-deps -d anchors
    python -m zipfile -e anchors/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl anchors/vllm-0.33.0
    python benchmarks/vllm_side_by_side.py [--source DIR (or VLLM_SOURCE)] [--samples 240] [--repeat 3]
    python benchmarks/vllm_side_by_side.py --convention vllm [--samples 240] [--repeat 3]

(a) For each family, ``--samples`` generated single samples (Qwen-VL: mmrope_qwen_vl.samples; Omni:
``mmrope_qwen3_omni.probe.random_batch``, every other one with audio in video; vLLM accepts no
separate audio then, so such samples are drawn again). Prints how many samples vLLM's positions
and deltas equal the reference's, and, for the others, where the first difference is (the token
there and the media item before it) and by how much vLLM is shifted (vLLM - reference, the
temporal row, or (t, h, w) when the rows differ).
(b) Times, with one torch thread, the reference (``implementation="reference"``), vLLM (its
``get_mrope_input_positions`` on the features its input processor builds, a Python loop over rows)
and mmrope (``engine.get_rope_index``; ``engine.compute_position_ids`` and the ``convention="vllm"``
engine's ``get_rope_index`` in columns of their own). Machines
are noisy: compare the ratios, measured in the same run.

``--convention vllm`` measures mmrope's ``convention="vllm"`` engines against vLLM instead (the
Omni families; see vllm_convention.py).

``--cases FILE`` writes short prompts and multi-turn rollouts with every token's position computed
by vLLM's code (the tests' ``vllm_cases.json``; see vllm_cases.py), once per release:

    python benchmarks/vllm_side_by_side.py --source anchors/vllm-0.34.0 --cases FILE [--families ...]
"""

from __future__ import annotations

import argparse
import collections
import random

import torch

from mmrope_core import MmropeError

from samples import Omni, built_family, omni_batch, omni_processor_outputs, vl_random_sample, vl_timing_batches
from timing import engine, environment, timed
from vllm_anchor import Anchor, Sample

VL_FAMILIES = ("Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "GLM-4V")
OMNI_FAMILIES = ("Qwen2.5-Omni", "Qwen3-Omni")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", help="the unzipped wheel (default: VLLM_SOURCE, else anchors/vllm-0.33.0)")
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--families", nargs="*", help="default: the Qwen-VL and Omni families "
                        "(with --cases: also those vLLM runs with their code, see vllm_cases.py)")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--convention", choices=("transformers", "vllm"), default="transformers",
                        help="vllm: mmrope's convention='vllm' engines against vLLM (Omni families)")
    parser.add_argument("--cases", help="write short cases computed by vLLM to this JSON file (see vllm_cases.py)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    anchor = Anchor(args.source)
    print(f"vLLM {anchor.version} from {anchor.source}; {environment()}\n")
    if args.cases:
        from vllm_cases import FAMILIES, write_cases

        write_cases(anchor, args.families or list(FAMILIES), args.cases)
        return
    args.families = args.families or [*VL_FAMILIES, *OMNI_FAMILIES]
    if args.convention == "vllm":
        from vllm_convention import main as convention_main

        convention_main(anchor, [Side(name, anchor) for name in args.families if name in OMNI_FAMILIES], args)
        return
    sides = {name: Side(name, anchor) for name in args.families}
    print(f"(a) {args.samples} generated single samples per family\n")
    for side in sides.values():
        side.compare(args.samples)
    if not args.no_timing:
        print(f"\n(b) best of {args.repeat} rounds, one torch thread\n")
        header = (f"{'case':<52}{'reference':>11}{'vLLM':>10}{'mmrope':>10}{'mmrope/vLLM':>13}{'ref/mmrope':>12}"
                  f"{'mmrope cpi':>12}{'vLLM = ref':>12}{'mmrope vllm':>16}")
        print(header)
        print("-" * len(header))
        for side in sides.values():
            for case in side.cases():
                side.time(*case, args.repeat)


class Side:
    """One family: its processor and config, the three implementations and their inputs."""

    def __init__(self, name: str, anchor: Anchor) -> None:
        self.name, self.anchor = name, anchor
        self.omni = name in OMNI_FAMILIES
        if self.omni:
            self.built = Omni(name)
        processor, config, self.tokens = built_family(name)
        self.processor, self.config = processor, config
        plugin = "qwen3_omni" if self.omni else "qwen_vl"
        self.fast = engine(processor, config, plugin)
        self.reference = engine(processor, config, plugin, implementation="reference")
        try:
            self.convention = engine(processor, config, plugin, convention="vllm")
        except MmropeError as exc:  # a family without a vLLM convention
            print(f"{name}: no vllm convention ({exc})")
            self.convention = None
        self.model = anchor.model(name, config, self.tokens)

    # -- (a) equality -----------------------------------------------------------------------------

    def compare(self, count: int) -> None:
        rng = random.Random(f"vllm side by side {self.name}")
        equal = fast_equal = fast_vllm = deltas_equal = redrawn = with_video = convention_equal = 0
        kinds: dict[str, list] = collections.defaultdict(list)
        for index in range(count):
            if self.omni:
                batch, again = self.built.random_sample(rng, use_audio_in_video=bool(index % 2))
                redrawn += again
            else:
                batch = vl_random_sample(self.processor, rng)
            ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
            kwargs = {k: v for k, v in batch.items() if v is not None}
            with_video += "video_grid_thw" in kwargs
            want, want_delta = self.reference.get_rope_index(ids, mask, **kwargs)
            got, _ = self.fast.get_rope_index(ids, mask, **kwargs)
            fast_equal += torch.equal(got, want)
            row = ids[0].tolist()
            positions, delta = self.anchor.positions(self.name, self.sample(row, kwargs), self.config, self.tokens)
            want = want[:, 0].double()
            positions = positions.double()
            deltas_equal += float(want_delta[0, 0]) == delta
            fast_vllm += torch.equal(got[:, 0].double(), positions)
            if self.convention is not None:
                ours, ours_delta = self.convention.get_rope_index(ids, mask, **kwargs)
                convention_equal += torch.equal(ours[:, 0].double(), positions) and float(ours_delta[0, 0]) == delta
            if torch.equal(positions, want):
                equal += 1
                continue
            first = int((positions != want).any(0).nonzero()[0])
            shift = (positions[:, first] - want[:, first]).tolist()
            kinds[self.where(row, first)].append(shift[0] if len(set(shift)) == 1 else tuple(shift))
        note = f"; {redrawn} audio-in-video samples drawn again (separate audio)" if redrawn else ""
        print(f"{self.name}: vLLM equals the reference in {equal}/{count} samples ({with_video} hold videos; "
              f"deltas {deltas_equal}/{count}); "
              f"mmrope fast equals the reference in {fast_equal}/{count}, vLLM in {fast_vllm}/{count}; "
              f"mmrope convention='vllm' equals vLLM (positions and delta) in "
              f"{convention_equal if self.convention is not None else '-'}/{count}{note}")
        for kind, shifts in sorted(kinds.items(), key=lambda item: -len(item[1])):
            print(f"    first difference at {kind}: {len(shifts)} samples, vLLM shifted by {_shifts(shifts)}")

    def sample(self, row: list[int], kwargs: dict) -> Sample:
        grids = {k: kwargs[k].tolist() for k in ("image_grid_thw", "video_grid_thw") if k in kwargs}
        seconds = kwargs.get("second_per_grid_ts", kwargs.get("second_per_grids"))
        frames = kwargs.get("audio_seqlens")
        return Sample(row, **grids, second_per_grid_ts=None if seconds is None else seconds.tolist(),
                      audio_feature_lengths=() if frames is None else frames.tolist(),
                      use_audio_in_video=bool(kwargs.get("use_audio_in_video", False)))

    def where(self, row: list[int], index: int) -> str:
        """The token at ``index`` and the media item it is in or follows, e.g. "vision end after video"."""
        t = self.tokens
        media = {t.image: "image", t.video: "video", t.audio: "audio"}
        names = {t.vision_start: "vision start", t.vision_end: "vision end", t.video_start: "video start",
                 t.video_end: "video end", t.audio_start: "audio start", t.audio_end: "audio end"}
        names |= {token: f"{kind} token" for token, kind in media.items()}
        with_audio = [i for i in range(1, len(row)) if row[i] == t.audio_start and row[i - 1] == t.vision_start]
        inside = any(start <= index <= row.index(t.vision_end, start) for start in with_audio)
        token = names.get(row[index], "text") + (" of a video with audio" if inside else "")
        before = next((i for i in range(index - 1, -1, -1) if row[i] in media), None)
        if inside or before is None or row[index] in media:
            return token
        kind = media[row[before]]
        if any(start < before < row.index(t.vision_end, start) for start in with_audio):
            kind = "video with audio"
        elif t.video_start is not None and row[:before].count(t.video_start) > row[:before].count(t.video_end):
            kind = "video"  # GLM: frames are image tokens between video markers
        return f"{token} after {kind}"

    # -- (b) time ---------------------------------------------------------------------------------

    def cases(self):
        if self.omni:
            rng = random.Random(f"vllm timing {self.name}")
            one = omni_batch([self.built.row(rng, 4096, True)])
            plain = omni_batch([self.built.row(rng, 8192, False) for _ in range(32)])
            with_audio = omni_batch([self.built.row(rng, 8192, True) for _ in range(32)])
            return [(f"{self.name} 1 x 4096, images + audio in video", one),
                    (f"{self.name} 32 x 8192, images, audios, videos", plain),
                    (f"{self.name} 32 x 8192, images + audio in video", with_audio)]
        return vl_timing_batches(self.name, self.processor)

    def time(self, name: str, batch: dict, repeat: int) -> None:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        kwargs = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask") and v is not None}
        if self.omni:
            inputs, processor_kwargs = omni_processor_outputs(kwargs)
        else:
            inputs, processor_kwargs = kwargs, None
        rows = self._vllm_rows(ids, mask, kwargs)
        want, _ = self.reference.get_rope_index(ids, mask, **kwargs)
        got, _ = self.fast.get_rope_index(ids, mask, **kwargs)
        placed = self.fast.compute_position_ids(ids, mask, inputs, processor_kwargs)
        assert torch.equal(got, want) and torch.equal(placed[:, 1:], want.transpose(0, 1).to(placed.dtype)), name
        vllm_equal = sum(torch.equal(self.model.get_mrope_input_positions(tokens, features)[0].double(),
                                     want[:, row, mask[row].bool()].double())
                         for row, (tokens, features) in enumerate(rows))
        model, convention = self.model, self.convention
        t = timed({
            "reference": lambda: self.reference.get_rope_index(ids, mask, **kwargs),
            "vllm": lambda: [model.get_mrope_input_positions(tokens, features) for tokens, features in rows],
            "mmrope": lambda: self.fast.get_rope_index(ids, mask, **kwargs),
            "mmrope cpi": lambda: self.fast.compute_position_ids(ids, mask, inputs, processor_kwargs),
            **({"mmrope vllm": lambda: convention.get_rope_index(ids, mask, **kwargs)} if convention else {}),
        }, repeat, block=1 if ids.numel() > 100_000 else 5)
        ms = {k: v * 1e3 for k, v in t.items()}
        print(f"{name:<52}{ms['reference']:>9.2f}ms{ms['vllm']:>8.2f}ms{ms['mmrope']:>8.3f}ms"
              f"{ms['mmrope'] / ms['vllm']:>12.3f}x{ms['reference'] / ms['mmrope']:>11.1f}x"
              f"{ms['mmrope cpi']:>10.3f}ms{f'{vllm_equal}/{len(rows)}':>12}"
              + (f"{ms['mmrope vllm']:>14.3f}ms" if "mmrope vllm" in ms else f"{'-':>16}"))

    def _vllm_rows(self, ids, mask, kwargs):
        """Each row's prompt tokens and the features vLLM's input processor would build for it."""
        taken = collections.Counter()
        per_row = []
        for row in range(ids.shape[0]):
            tokens = ids[row, mask[row].bool()].tolist()
            own = {"use_audio_in_video": kwargs.get("use_audio_in_video", False)}
            for key, n in self._items_in(tokens, kwargs, ids.shape[0]).items():
                if key in kwargs:
                    own[key] = kwargs[key][taken[key]:taken[key] + n]
                    taken[key] += n
            per_row.append((tokens, self.anchor.features(self.name, self.sample(tokens, own), self.config,
                                                         self.tokens)))
        return per_row

    def _items_in(self, tokens: list[int], kwargs: dict, rows: int) -> dict[str, int]:
        """How many images, videos (with their seconds) and audios a row holds: Qwen-VL rows here
        are alike; an Omni item begins with its start marker."""
        if not self.omni:
            return {key: len(value) // rows for key, value in kwargs.items() if isinstance(value, torch.Tensor)}
        t = self.tokens
        follows = [tokens[i + 1] for i, token in enumerate(tokens) if token == t.vision_start]
        videos = follows.count(t.video) + follows.count(t.audio_start)
        return {"image_grid_thw": follows.count(t.image), "video_grid_thw": videos, "second_per_grids": videos,
                "audio_seqlens": tokens.count(t.audio_start)}


def _shifts(shifts: list) -> str:
    plain = sorted({s for s in shifts if not isinstance(s, tuple)})
    rows = sorted({s for s in shifts if isinstance(s, tuple)})
    shown = [f"{s:+g}" for s in plain[:4]] + (["..", f"{plain[-1]:+g}"] if len(plain) > 5 else
                                              [f"{s:+g}" for s in plain[4:]])
    shown += ["(" + ", ".join(f"{v:+g}" for v in s) + ")" for s in rows[:3]] + (["..."] if len(rows) > 3 else [])
    return " ".join(shown)


if __name__ == "__main__":
    main()
