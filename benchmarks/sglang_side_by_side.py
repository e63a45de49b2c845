"""mmrope's ``convention="sglang"`` next to SGLang 0.5.23's own position code (read from its wheel,
see sglang_anchor.py), vLLM's (vllm_anchor.py) and the installed transformers': equality on
generated prompts and multi-turn rollouts, then time.

A developer tool, not run by CI. It needs the unzipped wheels (neither is ever installed):

    pip download sglang==0.5.23 --no-deps -d anchors
    python -m zipfile -e anchors/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl anchors/sglang-0.5.23
    python benchmarks/sglang_side_by_side.py [--source DIR (or SGLANG_SOURCE)] [--vllm-source DIR (or VLLM_SOURCE)]
        [--samples 240] [--rollouts 120] [--repeat 3] [--cases FILE]

(a) Prompts: for each family, ``--samples`` generated single samples (Qwen-VL:
mmrope_qwen_vl.samples; Qwen3-Omni: ``mmrope_qwen3_omni.probe.random_batch`` without audio in
video, which SGLang never computes). Counts the samples whose SGLang positions (as its prefill
uses them: int64) and deltas equal transformers' (the installed reference, truncated where it is
float), vLLM's, and mmrope's ``convention="sglang"``; where SGLang differs from transformers or
vLLM, where the first difference is and by how much.
(b) Rollouts: ``--rollouts`` generated trajectories per family, as verl's multi-turn agent loop
sends them: a prompt, then one to three turns, each a run of generated tokens, with tokens a tool
inserts (text, some with an image) between and sometimes after them. Every token's position in
SGLang's rollout (``SglangAnchor.rollout``: each run one request, its prompt prefilled, its tokens
decoded) against mmrope's ``convention="sglang"`` with ``generated_mask``, then the trajectories
in padded batches (left and right) and packed rows (``cu_seqlens``, ``segment_ids``), each
against its own rollout; and how many rollouts a prefill of the whole sequence (mmrope without
``generated_mask``) gets wrong. The same trajectories through vLLM (each request's prompt
prefilled by ``get_mrope_input_positions``, its tokens decoded by
``MRotaryEmbedding.get_next_input_positions_tensor``) against ``convention="vllm"`` without a mask.
(c) Times, with one torch thread: SGLang's function (a Python loop over rows), mmrope with
``convention="transformers"`` (tf) and with ``convention="sglang"``, ``get_rope_index`` and
``compute_position_ids`` (cpi), and for Qwen3-Omni with half its tokens in generated runs.
Machines are noisy: compare the ratios, measured in the same run.

``--cases FILE`` writes short cases computed by SGLang's code (the prompts and rollouts of the
tests' ``sglang_cases.json``).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import random
from typing import Any

import torch
from samples import vl_timing_batches
from sglang_anchor import Sample, SglangAnchor, add_anchor_arguments, anchors
from timing import engine, environment, timed
from trajectories import Trajectories

FAMILIES = ("Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen3.5", "GLM-4V", "GLM-4.6V", "Qwen3-Omni")
VLLM_FAMILIES = {"Qwen2-VL": "Qwen2-VL", "Qwen2.5-VL": "Qwen2.5-VL", "Qwen3-VL": "Qwen3-VL", "GLM-4V": "GLM-4V",
                 "Qwen3-Omni": "Qwen3-Omni"}  # vllm_anchor's names of the families it loads
# SGLang dispatches GLM-4.6V checkpoints to its GLM-4V code
ANCHOR_FAMILY = {"GLM-4.6V": "GLM-4V"}


def main() -> None:
    parser = argparse.ArgumentParser()
    add_anchor_arguments(parser)
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--rollouts", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--cases", help="write short cases computed by SGLang to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    anchor, vllm = anchors(args)
    print(f"{environment()}\n")
    sides = [Side(name, anchor, vllm) for name in args.families]
    if args.cases:
        families = [f"{json.dumps(side.name)}: [\n" + ",\n".join(json.dumps(case, separators=(",", ":"))
                                                                   for case in side.cases()) + "\n]" for side in sides]
        with open(args.cases, "w") as out:  # a case a line
            out.write("{\n" + ",\n".join(families) + "\n}\n")
        print(f"cases written to {args.cases}")
        return
    print(f"(a) {args.samples} generated prompts per family\n")
    for side in sides:
        side.compare(args.samples)
    print(f"\n(b) {args.rollouts} generated rollouts per family\n")
    for side in sides:
        side.compare_rollouts(args.rollouts)
    if not args.no_timing:
        print(f"\n(c) best of {args.repeat} rounds, one torch thread\n")
        header = (f"{'case':<52}{'SGLang':>10}{'mmrope tf':>12}{'mmrope sglang':>15}{'sglang/tf':>11}"
                  f"{'cpi tf':>10}{'cpi sglang':>12}{'sglang/tf':>11}")
        print(header)
        print("-" * len(header))
        for side in sides:
            for case in side.timing_cases():
                side.time(*case, args.repeat)


class Side(Trajectories):
    """One family: its samples, SGLang's and vLLM's functions, mmrope's engines."""

    def __init__(self, name: str, anchor: SglangAnchor, vllm: Any) -> None:
        super().__init__(name)
        self.anchor, self.vllm = anchor, vllm
        self.anchor_family = ANCHOR_FAMILY.get(name, name)
        processor, config = self.processor, self.config
        plugin = "qwen3_omni" if self.omni else "qwen_vl"
        self.transformers = engine(processor, config, plugin)
        self.reference = engine(processor, config, plugin, implementation="reference")
        self.sglang = engine(processor, config, plugin, convention="sglang")
        self.vllm_engine = engine(processor, config, plugin, convention="vllm")
        self.vllm_family = VLLM_FAMILIES.get(name) if vllm is not None else None

    # -- samples ------------------------------------------------------------------------------------

    def sample(self, row: list[int], media: dict[str, list]) -> Sample:
        return Sample(row, media["image_grid_thw"], media["video_grid_thw"], media["seconds"] or None,
                      media["audio_seqlens"])

    def sglang_prefill(self, row: list[int], media: dict[str, list]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.anchor.prefill(self.anchor_family, self.sample(row, media), self.config, self.tokens)

    def vllm_sample(self, row: list[int], media: dict[str, list]) -> Any:
        from vllm_anchor import Sample as VllmSample

        return VllmSample(row, media["image_grid_thw"], media["video_grid_thw"], media["seconds"] or None,
                          media["audio_seqlens"])

    def vllm_prefill(self, row: list[int], media: dict[str, list]) -> tuple[torch.Tensor, int]:
        positions, delta = self.vllm.positions(self.vllm_family, self.vllm_sample(row, media), self.config, self.tokens)
        return torch.as_tensor(positions), int(delta)

    # -- (a) prompts --------------------------------------------------------------------------------

    def compare(self, count: int) -> None:
        rng = random.Random(f"sglang side by side {self.name}")
        seen = collections.Counter()
        where: dict[str, list] = collections.defaultdict(list)
        for _ in range(count):
            row, media = self.prompt(rng)
            kwargs = self.kwargs(media)
            ids = torch.tensor([row])
            seen["videos"] += bool(media["video_grid_thw"])
            positions, delta = self.sglang_prefill(row, media)
            prefilled, delta = positions.to(torch.int64), int(torch.tensor(float(delta)).to(torch.int64))
            ours, our_delta = self.sglang.get_rope_index(ids, **kwargs)
            seen["mmrope"] += torch.equal(ours[:, 0], prefilled) and int(our_delta) == delta
            theirs, their_delta = self.reference.get_rope_index(ids, **kwargs)
            exact = theirs.dtype == positions.dtype and torch.equal(theirs[:, 0], positions)
            seen["transformers exactly"] += exact
            same = torch.equal(theirs[:, 0].to(torch.int64), prefilled)
            seen["transformers"] += same and int(their_delta.to(torch.int64)) == delta
            if not same:
                where["transformers"].append(self.first_difference(row, prefilled, theirs[:, 0].to(torch.int64)))
            if self.vllm_family is not None:
                vllm, vllm_delta = self.vllm_prefill(row, media)
                same = torch.equal(vllm.to(torch.int64), prefilled)
                seen["vllm"] += same and vllm_delta == delta
                if not same:
                    where["vLLM"].append(self.first_difference(row, prefilled, vllm.to(torch.int64)))
        vllm = f"{seen['vllm']}/{count}" if self.vllm_family is not None else "-"
        print(f"{self.name} ({self.sglang.binding.description}): {count} prompts, {seen['videos']} with videos. "
              f"SGLang's int64 positions and delta equal transformers' in {seen['transformers']} "
              f"(its own values exactly: {seen['transformers exactly']}), vLLM's in {vllm}; "
              f"mmrope convention='sglang' equals SGLang in {seen['mmrope']}/{count}")
        for other, found in where.items():
            kinds = collections.Counter(found)
            print(f"    differs from {other}: " + "; ".join(f"{kind} ({n})" for kind, n in kinds.most_common(4)))

    def first_difference(self, row: list[int], ours: torch.Tensor, theirs: torch.Tensor) -> str:
        """``"<token> after <item>, SGLang shifted by <s>"`` at the first differing token."""
        first = int((ours != theirs).any(0).nonzero()[0])
        shift = (ours[:, first] - theirs[:, first]).tolist()
        t = self.tokens
        kinds = {t.image: "image", t.video: "video", t.audio: "audio"}
        token = kinds.get(row[first], "text")
        before = next((kinds[row[i]] for i in range(first - 1, -1, -1) if row[i] in kinds), None)
        if t.video_start is not None and before == "image" and row[:first].count(t.video_start) > 0:
            before = "video"
        shown = f"{shift[0]:+d}" if len(set(shift)) == 1 else "(" + ", ".join(f"{s:+d}" for s in shift) + ")"
        return f"{token} token{f' after {before}' if before and token == 'text' else ''}, SGLang {shown}"

    # -- (b) rollouts -------------------------------------------------------------------------------

    def compare_rollouts(self, count: int) -> None:
        rng = random.Random(f"sglang rollouts {self.name}")
        seen = collections.Counter()
        trajectories = []
        for _ in range(count):
            row, generated, media = self.rollout(rng)
            want, delta = self.anchor.rollout(self.anchor_family, self.sample(row, media), generated, self.config,
                                              self.tokens)
            ids, mask = torch.tensor([row]), torch.tensor([generated])
            kwargs = self.kwargs(media)
            ours, our_delta = self.sglang.get_rope_index(ids, generated_mask=mask, **kwargs)
            seen["mmrope"] += torch.equal(ours[:, 0], want) and int(our_delta) == delta
            four = self.sglang.compute_position_ids(ids, None, self.inputs(kwargs), generated_mask=mask)
            seen["mmrope cpi"] += torch.equal(four[0, 1:], want) and torch.equal(four[0, 0], torch.arange(len(row)))
            whole, _ = self.sglang.get_rope_index(ids, **kwargs)
            seen["prefill of the whole"] += torch.equal(whole[:, 0], want)
            seen["tokens"] += len(row)
            seen["tokens moved"] += int((whole[:, 0] != want).any(0).sum())
            again, placements, as_whole = self.anchor.reprefilled(self.anchor_family, self.sample(row, media),
                                                                  generated, self.config, self.tokens, want)
            seen["rollouts re-prefilled"] += bool(again.any())
            seen["tokens re-prefilled"] += int(again.sum())
            seen["re-prefills"] += placements
            seen["re-prefilled as the whole"] += as_whole
            trajectories.append((row, generated, media, want))
            if self.vllm_family is not None:
                seen["vllm"] += self.vllm_rollout_matches(row, generated, media, kwargs)
        batched = self.in_batches(trajectories, rng)
        vllm = (f"; vLLM's rollout equals mmrope convention='vllm' (no mask) in {seen['vllm']}/{count}"
                if self.vllm_family is not None else "")
        print(f"{self.name}: mmrope convention='sglang' with generated_mask equals SGLang's rollout in "
              f"{seen['mmrope']}/{count} (compute_position_ids {seen['mmrope cpi']}/{count}); a prefill of the "
              f"whole sequence in {seen['prefill of the whole']}/{count} ({seen['tokens moved']} of "
              f"{seen['tokens']} tokens elsewhere){vllm}")
        print(f"    later turns prefill earlier replies elsewhere than SGLang decoded them in "
              f"{seen['rollouts re-prefilled']}/{count} rollouts ({seen['tokens re-prefilled']} tokens, "
              f"{seen['re-prefills']} prefills of them, {seen['re-prefilled as the whole']} where a prefill of the "
              f"whole sequence puts them)")
        print("    each rollout in " + ", ".join(f"{how}: {ok}/{count}" for how, ok in batched.items()))

    def inputs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Processor outputs for ``compute_position_ids`` from rope keyword arguments."""
        inputs = {key: kwargs[key] for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")
                  if key in kwargs}
        if "second_per_grids" in kwargs:
            inputs["video_second_per_grid"] = kwargs["second_per_grids"].tolist()
        if "audio_seqlens" in kwargs:
            frames = kwargs["audio_seqlens"]
            inputs["feature_attention_mask"] = (torch.arange(int(frames.max()))[None] < frames[:, None]).int()
        return inputs

    def vllm_rollout_matches(self, row, generated, media, kwargs) -> bool:
        """vLLM's rollout (:meth:`vllm_anchor.Anchor.rollout`) against convention='vllm' without a mask."""
        want, _ = self.vllm.rollout(self.vllm_family, self.vllm_sample(row, media), generated, self.config, self.tokens)
        ours, _ = self.vllm_engine.get_rope_index(torch.tensor([row]), **kwargs)
        return torch.equal(ours[:, 0], want)

    def in_batches(self, trajectories: list, rng: random.Random) -> dict[str, int]:
        """Groups of up to 8 trajectories padded (left or right) and packed, each against its own rollout."""
        ok = collections.Counter()
        for first in range(0, len(trajectories), 8):
            part = trajectories[first:first + 8]
            lengths = [len(row) for row, _, _, _ in part]
            width = max(lengths)
            left = rng.random() < 0.5
            ids = torch.full((len(part), width), self.pad, dtype=torch.long)
            mask = torch.zeros(len(part), width, dtype=torch.long)
            generated = torch.zeros(len(part), width, dtype=torch.long)
            for k, (row, gen, _, _) in enumerate(part):
                span = slice(width - len(row), width) if left else slice(0, len(row))
                ids[k, span], mask[k, span], generated[k, span] = torch.tensor(row), 1, torch.tensor(gen)
            merged = {key: [item for _, _, media, _ in part for item in media[key]]
                      for key in ("image_grid_thw", "video_grid_thw", "seconds", "audio_seqlens")}
            kwargs = self.kwargs(merged)
            positions, _ = self.sglang.get_rope_index(ids, mask, generated_mask=generated, **kwargs)
            ok["padded batches"] += sum(torch.equal(positions[:, k, mask[k].bool()], want)
                                        for k, (_, _, _, want) in enumerate(part))
            four = self.sglang.compute_position_ids(ids, mask, self.inputs(kwargs), generated_mask=generated)
            ok["padded compute_position_ids"] += sum(torch.equal(four[k, 1:, mask[k].bool()], want)
                                                     for k, (_, _, _, want) in enumerate(part))
            joined = torch.tensor([token for row, _, _, _ in part for token in row])[None]
            joined_generated = torch.tensor([g for _, gen, _, _ in part for g in gen])[None]
            bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
            packed, _ = self.sglang.get_rope_index(joined, cu_seqlens=bounds, generated_mask=joined_generated, **kwargs)
            ok["packed (cu_seqlens)"] += sum(torch.equal(packed[:, 0, bounds[k]:bounds[k + 1]], want)
                                             for k, (_, _, _, want) in enumerate(part))
            ids, segments, generated = self.two_per_row(part)
            packed, _ = self.sglang.get_rope_index(ids, segment_ids=segments, generated_mask=generated, **kwargs)
            flat = packed.reshape(3, -1)[:, segments.reshape(-1) > 0]
            starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
            ok["packed (segment_ids)"] += sum(torch.equal(flat[:, starts[k]:starts[k + 1]], want)
                                              for k, (_, _, _, want) in enumerate(part))
        return ok

    def two_per_row(self, part):
        """The trajectories two to a row, in order (``segment_ids`` 1 and 2, padding after)."""
        pairs = [part[i:i + 2] for i in range(0, len(part), 2)]
        width = max(sum(len(row) for row, _, _, _ in pair) for pair in pairs) + 3
        ids = torch.full((len(pairs), width), self.pad, dtype=torch.long)
        segments = torch.zeros(len(pairs), width, dtype=torch.long)
        generated = torch.zeros(len(pairs), width, dtype=torch.long)
        for r, pair in enumerate(pairs):
            at = 0
            for number, (row, gen, _, _) in enumerate(pair, start=1):
                span = slice(at, at + len(row))
                ids[r, span], generated[r, span], segments[r, span] = torch.tensor(row), torch.tensor(gen), number
                at += len(row)
        return ids, segments, generated

    # -- the tests' cases ---------------------------------------------------------------------------

    def cases(self, count: int = 8) -> list[dict[str, Any]]:
        """Short rollouts with SGLang's positions and delta (every other one its prompt alone),
        half of them with videos, the tokens written as symbols (see :meth:`symbols`)."""
        rng = random.Random(f"sglang cases {self.name}")
        out: list[dict[str, Any]] = []
        while len(out) < count:
            row, generated, media = self.rollout(rng)
            if len(row) > (600 if self.omni else 200) or (len(out) < count // 2 and not media["video_grid_thw"]):
                continue
            if len(out) % 2:
                length = generated.index(1)
                prompt = self.anchor.prompt_of(self.anchor_family, self.sample(row, media), length, self.tokens)
                row, generated = row[:length], [0] * length
                media = self.media_of(prompt)
            want, delta = self.anchor.rollout(self.anchor_family, self.sample(row, media), generated, self.config,
                                              self.tokens)
            out.append({"tokens": self.symbols(row), "generated": "".join(map(str, generated)), **media,
                        "positions": want.tolist(), "delta": delta})
        if self.name == "Qwen2.5-VL":
            out.append(self.seconds_first_case())
        if self.omni:
            out.append(self.decoded_case())
        return out

    def decoded_case(self) -> dict[str, Any]:
        """Text, a video of 4 frames of 48 tokens 0.5 s apart (temporal ids 0, 12.5, 25, 37.5), text,
        then two replies with a tool's text between them: each reply's prompt has a delta of -152.5
        or -153.5, so SGLang decodes it one position past where a prefill puts it."""
        t = self.tokens
        text, reply = [self.words[0]] * 3, [self.words[1]] * 5
        row = text + [t.vision_start] + [t.video] * 192 + [t.vision_end] + text + reply + text + reply
        generated = [0] * (len(row) - 13) + [1] * 5 + [0] * 3 + [1] * 5
        media = {"image_grid_thw": [], "video_grid_thw": [[4, 16, 12]], "seconds": [0.5], "audio_seqlens": []}
        want, delta = self.anchor.rollout(self.anchor_family, self.sample(row, media), generated, self.config,
                                          self.tokens)
        return {"tokens": self.symbols(row), "generated": "".join(map(str, generated)), **media,
                "positions": want.tolist(), "delta": delta}

    def seconds_first_case(self) -> dict[str, Any]:
        """At 25 tokens per second, a video of 14 frames 1.65 s apart, then a reply: SGLang's
        float32 (frame * seconds) * 25 truncates frame 12 to 494, transformers' frame * (25 *
        seconds) to 495 and vLLM's float64 product to 494.99 (494)."""
        config = copy.deepcopy(self.config)
        config.vision_config.tokens_per_second = 25
        t = self.tokens
        words = [self.words[0]] * 3
        row = words + [t.vision_start] + [t.video] * 14 + [t.vision_end] + words + [self.words[1]] * 4
        generated = [0] * (len(row) - 4) + [1] * 4
        media = {"image_grid_thw": [], "video_grid_thw": [[14, 2, 2]], "seconds": [1.65], "audio_seqlens": []}
        want, delta = self.anchor.rollout(self.anchor_family, self.sample(row, media), generated, config, self.tokens)
        return {"tokens": self.symbols(row), "generated": "".join(map(str, generated)), **media,
                "positions": want.tolist(), "delta": delta, "tokens_per_second": 25}

    # -- (c) time -----------------------------------------------------------------------------------

    def timing_cases(self):
        if self.omni:
            rng = random.Random(f"sglang timing {self.name}")
            from samples import omni_batch

            one = omni_batch([self.built.row(rng, 4096, False)])
            many = omni_batch([self.built.row(rng, 8192, False) for _ in range(32)])
            return [(f"{self.name} 1 x 4096, images, audios, videos", one, False),
                    (f"{self.name} 32 x 8192, images, audios, videos", many, False),
                    (f"{self.name} 32 x 8192, half the tokens generated", many, True)]
        return [(case, batch, False) for case, batch in vl_timing_batches(self.name, self.processor)]

    def time(self, name: str, batch: dict, generate: bool, repeat: int) -> None:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        kwargs = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask", "use_audio_in_video")
                  and v is not None}
        inputs = self.inputs(kwargs)
        generated = None
        if generate:  # runs of 64 generated tokens after the first quarter of each row's text
            generated = torch.zeros_like(ids)
            text = (ids == self.words[0]) | (ids == self.words[1])
            generated[:, ids.shape[1] // 4:] = (torch.arange(ids.shape[1] - ids.shape[1] // 4) // 64 % 2 == 0)
            generated &= text & (mask.bool() if mask is not None else True)
            generated[:, 0] = 0
        rows = [(ids[r][mask[r].bool()].tolist() if mask is not None else ids[r].tolist()) for r in range(ids.shape[0])]
        per_row = self.media_per_row(rows, kwargs)
        t = timed({
            "sglang": lambda: [self.sglang_prefill(row, media) for row, media in zip(rows, per_row)],
            "tf": lambda: self.transformers.get_rope_index(ids, mask, **kwargs),
            "ours": lambda: self.sglang.get_rope_index(ids, mask, generated_mask=generated, **kwargs),
            "cpi tf": lambda: self.transformers.compute_position_ids(ids, mask, inputs),
            "cpi ours": lambda: self.sglang.compute_position_ids(ids, mask, inputs, generated_mask=generated),
        }, repeat, block=1 if ids.numel() > 100_000 else 5)
        ms = {k: v * 1e3 for k, v in t.items()}
        print(f"{name:<52}{ms['sglang']:>8.2f}ms{ms['tf']:>10.3f}ms{ms['ours']:>13.3f}ms{ms['ours'] / ms['tf']:>10.2f}x"
              f"{ms['cpi tf']:>8.3f}ms{ms['cpi ours']:>10.3f}ms{ms['cpi ours'] / ms['cpi tf']:>10.2f}x")

    def media_per_row(self, rows: list[list[int]], kwargs: dict[str, Any]) -> list[dict[str, list]]:
        """Each row's media, taken in order: items begin with a start marker."""
        taken = collections.Counter()
        out = []
        for row in rows:
            sample = self.anchor.prompt_of(self.anchor_family, Sample(row, *self.all_media(kwargs, taken)), len(row),
                                           self.tokens)
            media = self.media_of(sample)
            taken.update({"image_grid_thw": len(media["image_grid_thw"]), "video_grid_thw": len(media["video_grid_thw"]),
                          "audio_seqlens": len(media["audio_seqlens"])})
            out.append(media)
        return out

    def all_media(self, kwargs: dict[str, Any], taken: collections.Counter) -> tuple:
        def rest(key):
            value = kwargs.get(key)
            return [] if value is None else value.tolist()[taken[key]:]

        seconds = kwargs.get("second_per_grids", kwargs.get("second_per_grid_ts"))
        return (rest("image_grid_thw"), rest("video_grid_thw"),
                None if seconds is None else seconds.tolist()[taken["video_grid_thw"]:], rest("audio_seqlens"))


if __name__ == "__main__":
    main()
