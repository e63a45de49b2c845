"""mmrope's ``convention="vllm"`` Omni engines next to vLLM 0.33's own position functions (read from
its wheel, see vllm_anchor.py): ``python benchmarks/vllm_side_by_side.py --convention vllm``.

(a) For each Omni family, ``--samples`` generated single samples (every other one with audio in
video; vLLM takes no separate audio then, so such samples are drawn again; every fifth sample with
videos passes no seconds per grid, so vLLM's default is used). A sample with audio in video is
compared in three token layouts: as generated (the video's tokens, then its audio's), as the
transformers processor lays it out (its own ``replace_video_with_audio_token``) and as vLLM lays
it out (its own prompt-update builder). On each, vLLM's ``get_mrope_input_positions`` (on the
features its input processor builds) against mmrope's batched kernel (on the compiled loops and
in numpy) and the engine (``get_rope_index`` and ``compute_position_ids``): positions, dtype and delta.
Then the samples (vLLM's layout) again in padded batches of 8, left and right padding, and
packed (one row with ``cu_seqlens``, two rows with ``segment_ids``): each sample must be what
vLLM computes for it alone. Prints the counts and, where they differ, the first difference.
(b) Times, with one torch thread: vLLM's function (a Python loop over rows), mmrope with
``convention="transformers"`` (tf) and with ``convention="vllm"`` (``get_rope_index``, and
``compute_position_ids``, cpi, in its own columns), and how many rows vLLM's positions equal
mmrope's there. Machines are noisy: compare the ratios, measured in the same run.
"""

from __future__ import annotations

import collections
import itertools
import random
from typing import Any

import torch
from timing import engine, timed

from mmrope_core import compiled
from mmrope_qwen3_omni.fast import FastRopeIndex

KERNELS = ("batched", "numpy", "engine", "engine cpi")
BATCH = 8


def main(anchor, sides, args) -> None:
    print(f"(a) mmrope convention='vllm' against vLLM's own functions, {args.samples} generated single samples "
          f"per family\n")
    compared = [Convention(side, anchor) for side in sides]
    for convention in compared:
        convention.compare(args.samples)
    if args.no_timing:
        return
    print(f"\n(b) best of {args.repeat} rounds, one torch thread\n")
    header = (f"{'case':<52}{'vLLM':>10}{'mmrope tf':>12}{'mmrope vllm':>13}{'vllm/tf':>9}{'cpi tf':>10}"
              f"{'cpi vllm':>10}{'vllm/tf':>9}{'vLLM = vllm':>13}")
    print(header)
    print("-" * len(header))
    for convention in compared:
        for case in convention.side.cases():
            convention.time(*case, args.repeat)


class Convention:
    """One Omni family: its convention='vllm' engine and kernels next to vLLM."""

    def __init__(self, side, anchor) -> None:
        self.side, self.anchor, self.name = side, anchor, side.name
        self.engine = engine(side.processor, side.config, "qwen3_omni", convention="vllm")
        bound = self.engine.binding.kernel
        markers = {"vision_end": side.tokens.vision_end, "audio_end": side.tokens.audio_end}
        kernel = FastRopeIndex(bound.family, bound.config, markers, bound.audio_rule, convention=bound.convention)
        self.kernels = {"batched": kernel, "numpy": InNumpy(kernel)}
        if not compiled.available():  # MMROPE_DISABLE_COMPILED or no compiler
            self.kernels.pop("batched")

    # -- (a) equality -----------------------------------------------------------------------------

    def compare(self, count: int) -> None:
        rng = random.Random(f"vllm convention {self.name}")
        equal: dict[tuple[str, str], int] = collections.Counter()
        seen: dict[str, int] = collections.Counter()
        differences: dict[tuple[str, str], list] = collections.defaultdict(list)
        parted = collections.Counter()  # samples whose layouts differ
        redrawn = defaulted = 0
        alone = []  # (vLLM's layout, kwargs, vLLM's positions, delta) per sample
        for index in range(count):
            use = bool(index % 2)
            batch, again = self.draw(rng, use)
            redrawn += again
            ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
            kwargs = {k: v for k, v in batch.items() if v is not None}
            if "video_grid_thw" in kwargs and rng.random() < 0.2:
                kwargs.pop("second_per_grids")
                defaulted += 1
            layouts = {"as generated": ids[0][mask[0].bool()].tolist()}
            if use:
                layouts["transformers processor"] = self.relaid(layouts["as generated"], kwargs, "processor")
                layouts["vLLM"] = self.relaid(layouts["as generated"], kwargs, "vLLM")
                parted["processor != vLLM"] += layouts["transformers processor"] != layouts["vLLM"]
                parted["generated != vLLM"] += layouts["as generated"] != layouts["vLLM"]
            for layout, tokens in layouts.items():
                want, delta = self.anchor.positions(self.name, self.side.sample(tokens, kwargs), self.side.config,
                                                    self.side.tokens)
                seen[layout] += 1
                for kernel, (positions, got_delta) in self.placed(tokens, kwargs).items():
                    if positions.dtype == want.dtype and torch.equal(positions, want) and got_delta == delta:
                        equal[layout, kernel] += 1
                    else:
                        differences[layout, kernel].append(self.difference(tokens, positions, want, got_delta, delta))
            alone.append((layouts["vLLM" if use else "as generated"], kwargs, want, delta))
        print(f"{self.name} ({self.engine.binding.description}): {count} samples, {seen['vLLM']} with audio in "
              f"video ({parted['processor != vLLM']} laid out differently by the transformers processor and vLLM, "
              f"{parted['generated != vLLM']} as generated and by vLLM); {defaulted} without seconds per grid; "
              f"{redrawn} drawn again (separate audio beside audio in video)")
        print(f"    {'layout':<24}{'samples':>8}" + "".join(f"{kernel:>14}" for kernel in KERNELS if kernel in
                                                           (*self.kernels, "engine", "engine cpi")))
        for layout in seen:
            cells = "".join(f"{f'{equal[layout, kernel]}/{seen[layout]}':>14}" for kernel in KERNELS
                            if kernel in (*self.kernels, "engine", "engine cpi"))
            print(f"    {layout:<24}{seen[layout]:>8}{cells}")
        batched = self.in_batches(alone, rng)
        print("    each sample alone in " + ", ".join(f"{how}: {ok}/{len(alone)}" for how, ok in batched.items()))
        for (layout, kernel), found in differences.items():
            print(f"    {layout}, {kernel}: first differences at " + "; ".join(sorted(set(found))[:4]))

    def draw(self, rng: random.Random, use_audio_in_video: bool) -> tuple[dict[str, Any], int]:
        """One generated sample vLLM accepts, and how many were drawn again: with audio in video,
        vLLM takes no audio of its own beside videos (without videos the flag changes nothing)."""
        from mmrope_qwen3_omni.probe import random_batch

        built, t = self.side.built, self.side.built.tokens
        for redrawn in range(1000):
            batch = random_batch(built.family, t, 2, built.thinker, rng, max_batch=1,
                                 use_audio_in_video=use_audio_in_video, text_ids=built.words, pad_id=built.pad)
            ids = batch["input_ids"][0].tolist()
            pairs = sum(ids[k] == t.vision_start and ids[k + 1] == t.audio_start for k in range(len(ids) - 1))
            if not use_audio_in_video or not pairs or ids.count(t.audio_start) == pairs:
                return batch, redrawn
        raise RuntimeError("no sample vLLM accepts in 1000 draws")

    def placed(self, tokens: list[int], kwargs: dict[str, Any]) -> dict[str, tuple[torch.Tensor, int]]:
        """Each mmrope path's (3, L) positions and delta for one sample."""
        ids = torch.tensor([tokens])
        out = {}
        for name, kernel in self.kernels.items():
            positions, deltas = kernel.rope_index(ids, None, **kwargs)
            out[name] = positions[:, 0], int(deltas[0, 0])
        positions, deltas = self.engine.get_rope_index(ids, **kwargs)
        out["engine"] = positions[:, 0], int(deltas[0, 0])
        rows = self.engine.compute_position_ids(ids, None, *self.processor_outputs(kwargs))
        assert torch.equal(rows[0, 0], torch.arange(len(tokens))), "the text row counts the tokens"
        out["engine cpi"] = rows[0, 1:], int(deltas[0, 0])
        return out

    @staticmethod
    def processor_outputs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        inputs = {k: kwargs[k] for k in ("image_grid_thw", "video_grid_thw") if k in kwargs}
        if "second_per_grids" in kwargs:
            inputs["video_second_per_grid"] = kwargs["second_per_grids"].tolist()
        frames = kwargs.get("audio_seqlens")
        if frames is not None:
            inputs["feature_attention_mask"] = (torch.arange(int(frames.max()))[None] < frames[:, None]).int()
        return inputs, {"use_audio_in_video": kwargs.get("use_audio_in_video", False)}

    def relaid(self, row: list[int], kwargs: dict[str, Any], builder: str) -> list[int]:
        """The sample with each video's tokens and its audio's between its audio markers in the
        order ``builder`` (the transformers processor, or vLLM) lays them out."""
        t = self.side.tokens
        out, video, at = [], 0, 0
        seconds = kwargs.get("second_per_grids")
        while at < len(row):
            if row[at] == t.vision_start and at + 1 < len(row) and row[at + 1] == t.audio_start:
                end = row.index(t.audio_end, at)
                audio_tokens = row[at:end].count(t.audio)
                grid = kwargs["video_grid_thw"][video].tolist()
                second = None if seconds is None else float(seconds[video])
                out += [t.vision_start] + self.layout(builder, audio_tokens, grid, second)
                at, video = end + 1, video + 1
                continue
            video += row[at] == t.vision_start and at + 1 < len(row) and row[at + 1] == t.video
            out.append(row[at])
            at += 1
        assert len(out) == len(row)
        return out

    def layout(self, builder: str, audio_tokens: int, grid: list[int], second: float | None) -> list[int]:
        if builder == "vLLM":
            return self.anchor.audio_in_video_tokens(self.name, self.side.config, self.side.tokens, audio_tokens,
                                                     grid, second)
        processor = self.side.processor
        second = (2.0 if self.name == "Qwen3-Omni" else 1.0) if second is None else second
        text = processor.replace_video_with_audio_token(
            {"video_grid_thw": [grid], "video_second_per_grid": [second]}, 0, {"num_audio_tokens": [audio_tokens]}, 0,
            position_id_per_seconds=processor.position_id_per_seconds, seconds_per_chunk=processor.seconds_per_chunk)
        return processor.tokenizer(text, add_special_tokens=False).input_ids

    def difference(self, tokens, positions, want, got_delta, delta) -> str:
        if positions.shape != want.shape:
            return f"shape {tuple(positions.shape)} (vLLM {tuple(want.shape)})"
        dtype = f"{positions.dtype} (vLLM {want.dtype}), " if positions.dtype != want.dtype else ""
        unequal = (positions.double() != want.double()).any(0).nonzero()
        if not unequal.numel():
            return f"{dtype}delta {got_delta} (vLLM {delta})"
        first = int(unequal[0])
        shift = (positions[:, first].double() - want[:, first].double()).tolist()
        return f"{dtype}{self.side.where(tokens, first)} (mmrope - vLLM {shift})"

    def in_batches(self, alone: list, rng: random.Random) -> dict[str, int]:
        """Samples of equal use_audio_in_video in padded and packed batches of up to 8, each
        sample's positions and delta against vLLM's for it alone."""
        ok: dict[str, int] = collections.Counter()
        groups: dict[bool, list] = collections.defaultdict(list)
        for sample in alone:
            groups[bool(sample[1].get("use_audio_in_video", False))].append(sample)
        for members in groups.values():
            for first in range(0, len(members), BATCH):
                part = members[first:first + BATCH]
                for how, matches in self.batch_outcomes(part, left=rng.random() < 0.5, split=rng.randint(1, len(part))):
                    ok[how] += sum(matches)
        return ok

    def batch_outcomes(self, part: list, left: bool, split: int):
        rows = [torch.tensor(tokens) for tokens, _, _, _ in part]
        kwargs = _joined_media([sample[1] for sample in part], self.engine.binding.kernel._default_seconds)
        lengths = [row.numel() for row in rows]
        width = max(lengths)
        ids = torch.full((len(rows), width), self.side.built.pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for index, row in enumerate(rows):
            span = slice(width - row.numel(), width) if left else slice(0, row.numel())
            ids[index, span], mask[index, span] = row, 1
        want = [(positions, delta) for _, _, positions, delta in part]

        def alike(positions, deltas, where):
            return [positions.dtype == w.dtype and torch.equal(positions[:, at], w) and int(deltas[k, 0]) == d
                    for k, ((w, d), at) in enumerate(zip(want, where))]

        positions, deltas = self.engine.get_rope_index(ids, mask, **kwargs)
        padded = [(slice(None), k, mask[k].bool()) for k in range(len(rows))]
        yield "padded batches", [positions.dtype == w.dtype and torch.equal(positions[:, k, m], w)
                                 and int(deltas[k, 0]) == d for (w, d), (_, k, m) in zip(want, padded)]
        inputs, processor_kwargs = self.processor_outputs(kwargs)
        four = self.engine.compute_position_ids(ids, mask, inputs, processor_kwargs)
        yield "padded compute_position_ids", [torch.equal(four[k, 1:, m], w) and
                                              torch.equal(four[k, 0, m], torch.arange(int(m.sum())))
                                              for (w, _), (_, k, m) in zip(want, padded)]
        row = torch.cat(rows)[None]
        bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        positions, deltas = self.engine.get_rope_index(row, cu_seqlens=bounds, **kwargs)
        spans = [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds.tolist())]
        yield "packed (cu_seqlens)", alike(positions[:, 0], deltas, spans)
        # two rows of segments, padding after each row's
        halves = (list(range(split)), list(range(split, len(rows))))
        halves = tuple(h for h in halves if h)
        wide = max(sum(lengths[k] for k in h) for h in halves) + 3
        ids = torch.full((len(halves), wide), self.side.built.pad, dtype=torch.long)
        segments = torch.zeros(len(halves), wide, dtype=torch.long)
        where = {}
        for r, half in enumerate(halves):
            column = 0
            for number, k in enumerate(half, start=1):
                ids[r, column:column + lengths[k]] = rows[k]
                segments[r, column:column + lengths[k]] = number
                where[k] = (r, slice(column, column + lengths[k]))
                column += lengths[k]
        positions, deltas = self.engine.get_rope_index(ids, segment_ids=segments, **kwargs)
        yield "packed (segment_ids)", [positions.dtype == w.dtype and torch.equal(positions[:, where[k][0], where[k][1]], w)
                                       and int(deltas[k, 0]) == d for k, (w, d) in enumerate(want)]

    # -- (b) time ---------------------------------------------------------------------------------

    def time(self, name: str, batch: dict, repeat: int) -> None:
        side = self.side
        ids, mask = batch["input_ids"], batch["attention_mask"]
        kwargs = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask") and v is not None}
        inputs, processor_kwargs = self.processor_outputs(kwargs)
        rows = side._vllm_rows(ids, mask, kwargs)
        got, _ = self.engine.get_rope_index(ids, mask, **kwargs)
        vllm_equal = sum(torch.equal(side.model.get_mrope_input_positions(tokens, features)[0], got[:, row, mask[row].bool()])
                         for row, (tokens, features) in enumerate(rows))
        model, transformers_engine = side.model, side.fast
        block = 1 if ids.numel() > 100_000 else 5
        # apart: the allocations of vLLM's loop would make the call after it find no memory mapped
        t = timed({"vllm": lambda: [model.get_mrope_input_positions(tokens, features) for tokens, features in rows]},
                  repeat, block)
        t |= timed({
            "transformers": lambda: transformers_engine.get_rope_index(ids, mask, **kwargs),
            "convention": lambda: self.engine.get_rope_index(ids, mask, **kwargs),
            "transformers cpi": lambda: transformers_engine.compute_position_ids(ids, mask, inputs, processor_kwargs),
            "convention cpi": lambda: self.engine.compute_position_ids(ids, mask, inputs, processor_kwargs),
        }, repeat, block)
        ms = {k: v * 1e3 for k, v in t.items()}
        print(f"{name:<52}{ms['vllm']:>8.2f}ms{ms['transformers']:>10.3f}ms{ms['convention']:>11.3f}ms"
              f"{ms['convention'] / ms['transformers']:>8.2f}x{ms['transformers cpi']:>8.3f}ms"
              f"{ms['convention cpi']:>8.3f}ms{ms['convention cpi'] / ms['transformers cpi']:>8.2f}x"
              f"{f'{vllm_equal}/{len(rows)}':>13}")


def _joined_media(each: list[dict[str, Any]], default_seconds: float) -> dict[str, Any]:
    """The samples' keyword arguments as one batch's: media in order; vLLM's default seconds per
    grid written out where a sample passed none (a batch passes them for every video or none)."""
    out: dict[str, Any] = {"use_audio_in_video": bool(each[0].get("use_audio_in_video", False))}
    for kwargs in each:
        kwargs = dict(kwargs)
        if "video_grid_thw" in kwargs and "second_per_grids" not in kwargs:
            kwargs["second_per_grids"] = torch.full((kwargs["video_grid_thw"].shape[0],), default_seconds)
        for key in ("image_grid_thw", "video_grid_thw", "second_per_grids", "audio_seqlens"):
            if key in kwargs:
                out[key] = torch.cat([out[key], kwargs[key]]) if key in out else kwargs[key]
    return out


class InNumpy:
    """A kernel whose calls run with the compiled loops switched off."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            with compiled.switched_off():
                return getattr(self.kernel, name)(*args, **kwargs)

        return call
