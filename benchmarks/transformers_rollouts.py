"""The rollout engines' positions for the model types mmrope-transformers binds, next to transformers'
and mmrope's conventions: SGLang 0.5.23's and vLLM's own position code (read from their wheels, see
sglang_anchor.py and vllm_anchor.py) on generated samples laid out as each processor lays them out.

A developer tool, not run by CI. It needs the unzipped wheels (never installed); vLLM's code loads
once per process, so run it once per vLLM release:

    python benchmarks/transformers_rollouts.py [--source DIR (SGLANG_SOURCE)] [--vllm-source DIR (VLLM_SOURCE)]
        [--samples 240] [--rollouts 60] [--model-types ...] [--cases FILE] [--no-timing]

Which code each engine runs for a model type is read off the engines' own dispatch (see
:data:`SGLANG` and :data:`VLLM`; the model types left out of each are those the engine does not
run). For each model type that an engine runs:

(a) ``--samples`` generated samples (``mmrope_transformers.layouts.random_batch``, one sample
each; MiniCPM-V 4.7: its processor's own output): the engine's positions and delta against
transformers' (the plugin's reference) and against mmrope's convention for that engine.
(b) ``--rollouts`` generated rollouts: a sample, then one to three runs of generated text with a
tool's text between them; each run one request to the engine (its prompt every token before it,
prefilled, then decoded), against mmrope's convention with ``generated_mask``.
(c) Times of mmrope's convention against its transformers convention on batches of 16.

The configs are the model types' tiny ones as checkpoints carry them: the token ids the engines
read from the config, PaddleOCR-VL's ``vision_config.tokens_per_second`` and, for MiniCPM-V 4.7,
the canvas switched on (``mrope_mode="canvas"``), without which both engines give every token its
index.

``--cases FILE`` writes short rollouts with the engine's positions (the tests' cases), merged
into FILE's cases of other releases.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from sglang_anchor import Sample, SglangAnchor, add_anchor_arguments, anchors
from timing import engine, environment, timed
from vllm_anchor import Tokens

from mmrope_core import InvalidInputError, RopeEngine, UnknownConventionError
from mmrope_core.tiny import padded_batch
from mmrope_transformers import examples
from mmrope_transformers.layouts import LAYOUTS, processor_batch, random_batch
from mmrope_transformers.models import decide
from mmrope_transformers.reference import ConfigOnlyModel

MODEL_TYPES = ("paddleocr_vl", "qwen4_exp", "cosmos3_omni", "cosmos3_edge", "cohere_compass", "glm_ocr", "glmga",
               "ernie4_5_vl_moe", "hy_v4_vl", "hunyuan_vl", "minicpmv4_7", "glm_image")

#: How SGLang 0.5.23 computes each model type's prompt positions, read from its code: its
#: multimodal processor is chosen by the checkpoint's architecture, and calls ``get_rope_index``
#: with the config's ``model_type`` (which picks a branch), ``get_rope_index_glm4v``, or a function
#: of its own. Model types left out have no SGLang model (cohere_compass, glmga, hy_v4_vl,
#: hunyuan_vl: its Transformers backend computes M-RoPE positions only for the model types its
#: get_rope_index names, and raises "Unimplemented model type" for the others) or one that reads a
#: config transformers' does not have (ernie4_5_vl_moe: ``im_patch_id``, ``spatial_conv_size``).
SGLANG = {
    "paddleocr_vl": "get_rope_index",  # PaddleOCRVLImageProcessor (QwenVLImageProcessor), Qwen2.5-VL's branch
    "qwen4_exp": "get_rope_index",  # QwenVLImageProcessor, Qwen3-VL's branches (and its images-only path)
    "cosmos3_omni": "get_rope_index",  # QwenVLImageProcessor (Cosmos3ForConditionalGeneration), as qwen4_exp
    "cosmos3_edge": "get_rope_index",  # Cosmos3EdgeProcessor, Qwen3-VL's branches
    "glm_ocr": "get_rope_index_glm4v",  # Glm4vImageProcessor
    "glm_image": "GlmImageProcessor._compute_glm_image_mrope_positions",
    "minicpmv4_7": "compute_canvas_positions",  # MiniCPMV4_7MultimodalProcessor
}
#: How vLLM 0.33 and 0.34 compute them: the checkpoint's architecture picks a model class
#: (``vllm_anchor.FAMILIES`` by model type) whose ``get_mrope_input_positions`` is the code; an
#: architecture vLLM has no model of is served by its Transformers backend (model_impl "auto"),
#: whose method calls the transformers model's own ``get_rope_index`` on each request, with token
#: types from the placeholder ranges (the layout named here). ernie4_5_vl_moe is left out: vLLM's
#: Ernie4_5_VLMoeForConditionalGeneration reads ``spatial_conv_size``, which transformers' config
#: does not have.
VLLM = {"paddleocr_vl": "paddleocr_vl", "qwen4_exp": "qwen4_exp", "cosmos3_omni": "cosmos3_omni",
        "cosmos3_edge": "cosmos3_edge", "cohere_compass": "cohere_compass", "glm_ocr": "glm_ocr",
        "minicpmv4_7": "minicpmv4_7"}
VLLM_TRANSFORMERS_BACKEND = {"glmga": "GLM-4V", "hy_v4_vl": "any runs", "hunyuan_vl": "any runs",
                             "glm_image": "any runs"}


def main() -> None:
    parser = argparse.ArgumentParser()
    add_anchor_arguments(parser)
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--rollouts", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model-types", nargs="*", default=list(MODEL_TYPES))
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--cases", help="write short cases computed by the engines to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    sglang, vllm = anchors(args)
    print(f"{environment()}\n")
    sides = [Side(model_type, sglang, vllm) for model_type in args.model_types]
    if args.cases:  # merged into the file's cases of other releases
        found = json.loads(Path(args.cases).read_text()) if Path(args.cases).is_file() else {}
        found.update({f"{side.model_type} {release}": cases for side in sides for release, cases in side.cases().items()})
        with open(args.cases, "w") as out:  # a case a line
            out.write("{\n" + ",\n".join(
                f"{json.dumps(name)}: [\n" + ",\n".join(json.dumps(case, separators=(",", ":")) for case in cases)
                + "\n]" for name, cases in sorted(found.items())) + "\n}\n")
        print(f"cases written to {args.cases}")
        return
    print(f"(a) {args.samples} generated samples per model type\n")
    for side in sides:
        side.compare(args.samples)
    print(f"\n(b) {args.rollouts} generated rollouts per model type\n")
    for side in sides:
        side.compare_rollouts(args.rollouts)
    if not args.no_timing:
        print(f"\n(c) best of {args.repeat} rounds, one torch thread, batches of 16\n")
        for side in sides:
            side.time(args.repeat)


class Engine:
    """One rollout engine's code for one model type: ``prefill(row, media)`` is its ``(3, L)``
    positions and delta of a request whose prompt is ``row``; ``decode(positions, delta, index)``
    the position of the token it decodes at ``index``."""

    def __init__(self, name: str, release: str, prefill: Callable, decode: Callable) -> None:
        self.name, self.prefill, self.decode = name, prefill, decode
        self.release = release  # the convention naming this release, e.g. "vllm-0.33"
        self.convention = release.split("-")[0]  # the alias of the newest release mmrope knows


class Side:
    """One model type: its processor and config, the engines' code, mmrope's engines."""

    def __init__(self, model_type: str, sglang: SglangAnchor, vllm: Any) -> None:
        self.model_type = model_type
        spec = examples.spec_of(model_type)
        self.processor, self.config = examples.build(spec)
        if model_type == "minicpmv4_7":  # the engines lay the canvas out where the config switches it on
            self.config.mrope_mode = "canvas"
        self.tokens = tokens_of(model_type, self.processor)
        self.words = self.processor.tokenizer.convert_tokens_to_ids(["the", "cat", "sat", "on"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self.transformers = engine(self.processor, self.config, "transformers")
            self.reference = engine(self.processor, self.config, "transformers", implementation="reference")
        self.engines: list[Engine] = []
        if model_type in SGLANG:
            self.engines.append(self.sglang_engine(sglang))
        if vllm is not None and (model_type in VLLM or model_type in VLLM_TRANSFORMERS_BACKEND):
            self.engines.append(self.vllm_engine(vllm))
        self.mmrope: dict[str, Any] = {}
        for side in self.engines:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    self.mmrope[side.name] = engine(self.processor, self.config, "transformers",
                                                    convention=side.release)
            except UnknownConventionError as exc:
                self.mmrope[side.name] = exc

    # -- the engines --------------------------------------------------------------------------------

    def engine_config(self) -> Any:
        """The config as a checkpoint carries it: the ids the engines read from it (and PaddleOCR-VL's
        ``vision_config.tokens_per_second``, which its checkpoints' own config class sets, 2 by
        default, and transformers' leaves out: SGLang's get_rope_index multiplies by it)."""
        config = copy.deepcopy(self.config)
        if self.model_type == "paddleocr_vl" and getattr(config.vision_config, "tokens_per_second", None) is None:
            config.vision_config.tokens_per_second = 2
        t = self.tokens
        for name, value in (("image_token_id", t.image), ("video_token_id", t.video),
                            ("vision_start_token_id", t.vision_start), ("vision_end_token_id", t.vision_end),
                            ("video_start_token_id", t.video_start), ("video_end_token_id", t.video_end)):
            if value is not None and value >= 0:
                setattr(config, name, value)
        return config

    def sglang_engine(self, sglang: SglangAnchor) -> Engine:
        config = self.engine_config()
        if self.model_type == "glm_image":
            glm_image = sglang.glm_image_processor(config)

            def prefill(row, media):
                grids = torch.tensor(media["image_grid_thw"], dtype=torch.long).reshape(-1, 3)
                return glm_image(torch.tensor(row), grids if grids.numel() else None)
        elif self.model_type == "minicpmv4_7":
            canvas = sglang.minicpmv4_7_processor(config)

            def prefill(row, media):
                return canvas(row, media["target_sizes"])
        else:
            def prefill(row, media):
                sample = Sample(row, media["image_grid_thw"], media["video_grid_thw"])
                return sglang.prefill(self.model_type, sample, config, self.tokens)

        def decode(positions, delta, index):
            return sglang.decode(positions, delta, index + 1)[:, 0]

        return Engine(f"SGLang {sglang.version}", f"sglang-{sglang.version}", prefill, decode)

    def vllm_engine(self, vllm: Any) -> Engine:
        from vllm_anchor import Sample as VllmSample

        config = self.engine_config()
        if self.model_type in VLLM:
            family, layout, instance = VLLM[self.model_type], None, {}
            if self.model_type == "minicpmv4_7":
                instance = {"_uses_canvas_mrope": True, "_canvas_special_ids": {
                    "im_start_id": config.image_start_id, "im_end_id": config.image_end_id,
                    "slice_start_id": config.slice_start_id, "slice_end_id": config.slice_end_id,
                    "newline_id": config.newline_id}}
        else:
            decision = decide(self.config)
            family, layout = "transformers backend", VLLM_TRANSFORMERS_BACKEND[self.model_type]
            instance = {"model": ConfigOnlyModel(decision.model_class, decision.config)}

        def prefill(row, media):
            sample = VllmSample(row, media["image_grid_thw"], media["video_grid_thw"])
            if self.model_type == "minicpmv4_7":
                return vllm.minicpmv4_7_positions(sample, config, self.tokens, media["target_sizes"], **instance)
            positions, delta = vllm.positions(family, sample, config, self.tokens, layout=layout, **instance)
            return torch.as_tensor(positions), torch.tensor([[int(delta)]])

        def decode(positions, delta, index):
            return vllm.decode(int(delta), index, 1)[:, 0]

        return Engine(f"vLLM {vllm.version}", f"vllm-{'.'.join(vllm.version.split('.')[:2])}", prefill, decode)

    # -- samples ------------------------------------------------------------------------------------

    def sample(self, rng: random.Random) -> tuple[list[int], dict[str, Any], dict[str, Any]]:
        """One generated sample: its tokens, its media (lists), and mmrope's get_rope_index kwargs."""
        if self.model_type in LAYOUTS:
            batch = random_batch(self.model_type, self.processor, self.config, rng, samples=1)
            while "target_sizes_videos" in batch:  # the anchors place MiniCPM-V's images only
                batch = random_batch(self.model_type, self.processor, self.config, rng, samples=1)
            ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
            kwargs = batch
        else:
            ids, mask, inputs = self.reference.batch(processor_batch(self.model_type, self.processor, rng,
                                                                     max_batch=1))
            kwargs = self.reference.rope_index_kwargs(inputs)
        row = ids[0][mask[0].bool()].tolist()
        media = {key: kwargs[key].tolist() if key in kwargs else []
                 for key in ("image_grid_thw", "video_grid_thw", "target_sizes")}
        return row, media, kwargs

    # -- (a) prompts --------------------------------------------------------------------------------

    def compare(self, count: int) -> None:
        rng = random.Random(f"transformers rollouts {self.model_type}")
        samples = [self.sample(rng) for _ in range(count)]
        videos = sum(bool(media["video_grid_thw"]) for _, media, _ in samples)
        if not self.engines:
            print(f"{self.model_type}: no engine runs it")
        for side in self.engines:
            seen, where = collections.Counter(), collections.Counter()
            for row, media, kwargs in samples:
                ids = torch.tensor([row])
                ours = self.mmrope[side.name]
                try:
                    positions, delta = side.prefill(row, media)
                except Exception as exc:  # the engine's own failure on this sample: no rollout holds it
                    seen["fails"] += 1
                    where[f"the engine fails: {type(exc).__name__}: {str(exc)[:80]}"] += 1
                    if not isinstance(ours, Exception):
                        try:
                            ours.get_rope_index(torch.tensor([row]), **kwargs)
                        except InvalidInputError:
                            seen["mmrope refuses"] += 1
                    continue
                # (GLM-Image: the target grids' decode positions follow the prompt's)
                positions = torch.as_tensor(positions).to(torch.int64)[:, :len(row)]
                delta = int(torch.as_tensor(delta).reshape(-1)[0])
                theirs, their_delta = self.reference.get_rope_index(ids, **kwargs)
                same = theirs.shape[0] == positions.shape[0] and torch.equal(theirs[:, 0].to(torch.int64), positions)
                seen["transformers"] += same and int(their_delta) == delta
                if not same:
                    where[self.first_difference(row, positions, theirs[:, 0])] += 1
                if not isinstance(ours, Exception):
                    got, got_delta = ours.get_rope_index(ids, **kwargs)
                    seen["mmrope"] += torch.equal(got[:, 0], positions) and int(got_delta) == delta
            ours = self.mmrope[side.name]
            mmrope = (f"mmrope convention={side.release!r} ({ours.binding.description}) equals it in "
                      f"{seen['mmrope']}" if not isinstance(ours, Exception) else f"mmrope refuses: {ours}")
            failed = (f", fails on {seen['fails']} (mmrope's convention refuses {seen['mmrope refuses']} of them)"
                      if seen["fails"] else "")
            print(f"{self.model_type} vs {side.name}: {count} samples, {videos} with videos; the engine's positions "
                  f"and delta equal transformers' in {seen['transformers']}{failed}; {mmrope}")
            for kind, n in where.most_common(4):
                print(f"    {kind} ({n})")

    def first_difference(self, row: list[int], ours: torch.Tensor, theirs: torch.Tensor) -> str:
        if ours.shape != theirs.shape:
            return f"shape {tuple(ours.shape)}, transformers {tuple(theirs.shape)}"
        first = int((ours != theirs.to(ours.dtype)).any(0).nonzero()[0])
        t = self.tokens
        kinds = {t.image: "image", t.video: "video"}
        token = kinds.get(row[first], "text")
        before = next((kinds[row[i]] for i in range(first - 1, -1, -1) if row[i] in kinds), None)
        shift = (ours[:, first] - theirs[:, first].to(ours.dtype)).tolist()
        return f"first at a {token} token{f' after {before}' if before and token == 'text' else ''}: shifted {shift}"

    # -- (b) rollouts -------------------------------------------------------------------------------

    def rollout(self, rng: random.Random) -> tuple[list[int], list[int], dict[str, Any], dict[str, Any]]:
        """A sample, then 1 to 3 runs of generated text, a tool's text between them and, one time
        in three, after the last."""
        row, media, kwargs = self.sample(rng)
        generated = [0] * len(row)
        turns = rng.randint(1, 3)
        for turn in range(turns):
            run = [rng.choice(self.words) for _ in range(rng.randint(1, 12))]
            row, generated = row + run, generated + [1] * len(run)
            if turn + 1 < turns or rng.random() < 1 / 3:
                tool = [rng.choice(self.words) for _ in range(rng.randint(1, 6))]
                row, generated = row + tool, generated + [0] * len(tool)
        return row, generated, media, kwargs

    def engine_rollout(self, side: Engine, row: list[int], generated: list[int],
                       media: dict[str, Any]) -> torch.Tensor:
        """Every token's position in the engine's rollout: each run of generated tokens one request,
        prompted with every token before it (all media are in the first prompt), prefilled, then
        decoded; a prefill of the whole sequence for the tokens after the last run."""
        out = torch.full((3, len(row)), -1, dtype=torch.int64)
        starts = [i for i, flag in enumerate(generated) if flag and (i == 0 or not generated[i - 1])]
        for start in [*starts, len(row)]:
            positions, delta = side.prefill(row[:start], media)
            positions = torch.as_tensor(positions).to(torch.int64)
            keep = out[:, :start] < 0
            out[:, :start][keep] = positions[:, :start][keep]
            end = start
            while end < len(row) and generated[end]:
                out[:, end] = side.decode(positions, delta, end)
                end += 1
        return out

    def compare_rollouts(self, count: int) -> None:
        rng = random.Random(f"transformers rollouts (b) {self.model_type}")
        trajectories = [self.rollout(rng) for _ in range(count)]
        for side in self.engines:
            ours = self.mmrope[side.name]
            if isinstance(ours, Exception):
                continue
            seen = collections.Counter()
            for row, generated, media, kwargs in trajectories:
                try:
                    want = self.engine_rollout(side, row, generated, media)
                except Exception:
                    seen["fails"] += 1
                    continue
                ids, mask = torch.tensor([row]), torch.tensor([generated])
                got, _ = ours.get_rope_index(ids, generated_mask=mask, **kwargs)
                seen["mmrope"] += torch.equal(got[:, 0], want)
                whole, _ = ours.get_rope_index(ids, **kwargs)
                seen["whole"] += torch.equal(whole[:, 0], want)
            failed = f" (the engine fails on {seen['fails']})" if seen["fails"] else ""
            print(f"{self.model_type} vs {side.name}: mmrope convention={side.release!r} with generated_mask "
                  f"equals the engine's rollout in {seen['mmrope']}/{count}, without it in "
                  f"{seen['whole']}/{count}{failed}")

    # -- (c) time -----------------------------------------------------------------------------------

    def time(self, repeat: int) -> None:
        rng = random.Random(f"transformers rollouts (c) {self.model_type}")
        if self.model_type in LAYOUTS:
            batch = random_batch(self.model_type, self.processor, self.config, rng, samples=16, max_items=8, side=12)
            ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
            kwargs = batch
        else:
            ids, mask, inputs = self.reference.batch(processor_batch(self.model_type, self.processor, rng,
                                                                     max_batch=16, max_images=6))
            kwargs = self.reference.rope_index_kwargs(inputs)
        if "video_grid_thw" in kwargs and any(isinstance(ours, RopeEngine) and "WithoutVideos" in repr(ours.binding.kernel)
                                              for ours in self.mmrope.values()):
            ids, mask, kwargs = self.images_only(rng, 16)  # what the engine refusing videos takes
        fns = {"transformers": lambda: self.transformers.get_rope_index(ids, mask, **kwargs)}
        for ours in self.mmrope.values():
            if not isinstance(ours, Exception):
                fns[ours.convention] = lambda ours=ours: ours.get_rope_index(ids, mask, **kwargs)
        t = timed(fns, repeat)
        base = t.pop("transformers")
        print(f"{self.model_type:<18}{'x'.join(map(str, ids.shape)):>10}  transformers {base * 1e3:.3f} ms; "
              + "; ".join(f"{name} {value * 1e3:.3f} ms ({value / base:.2f}x)" for name, value in t.items()))

    def images_only(self, rng: random.Random, rows: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """A right-padded batch of ``rows`` generated samples without videos."""
        drawn = []
        while len(drawn) < rows:
            row, media, _ = self.sample(rng)
            if not media["video_grid_thw"]:
                drawn.append((row, media["image_grid_thw"]))
        ids, mask = padded_batch([row for row, _ in drawn], self.processor.tokenizer.pad_token_id, left=False)
        grids = [grid for _, images in drawn for grid in images]
        return ids, mask, {"image_grid_thw": torch.tensor(grids)} if grids else {}

    # -- the tests' cases ---------------------------------------------------------------------------

    def cases(self, count: int = 4) -> dict[str, list[dict[str, Any]]]:
        """Short rollouts with each engine's positions (of every token, in the engine's rollout),
        half of them with videos where the engine takes videos; the tokens as the tokenizer
        writes them."""
        out: dict[str, list[dict[str, Any]]] = {}
        tokenizer = self.processor.tokenizer
        for side in self.engines:
            ours = self.mmrope[side.name]
            if isinstance(ours, Exception):
                continue
            videos = self.model_type in LAYOUTS and LAYOUTS[self.model_type][1] is not None \
                and "WithoutVideos" not in repr(ours.binding.kernel)
            rng = random.Random(f"transformers rollouts cases {self.model_type} {side.convention}")
            found: list[dict[str, Any]] = []
            while len(found) < count:
                row, generated, media, kwargs = self.rollout(rng)
                if len(row) > 120 or (videos and len(found) < count // 2 and not media["video_grid_thw"]):
                    continue
                try:
                    want = self.engine_rollout(side, row, generated, media)
                except Exception:  # a sample the engine does not take (no rollout holds it)
                    continue
                found.append({"tokens": tokenizer.convert_ids_to_tokens(row), "generated": "".join(map(str, generated)),
                              **{key: value.tolist() if isinstance(value, torch.Tensor) else value
                                 for key, value in kwargs.items()},
                              "positions": want.tolist()})
            out[side.release] = found
        return out


def tokens_of(model_type: str, processor: Any) -> Tokens:
    """The placeholders' and markers' ids of the model type's tiny processor (-1 where it has none)."""
    tokens = examples.spec_of(model_type).tokens
    ids = {name: processor.tokenizer.convert_tokens_to_ids(text) for name, text in tokens.items()}
    start = next(ids[name] for name in ("vision_start_token", "begin_of_image_token", "image_start_token",
                                        "bos_token") if name in ids)
    end = next(ids[name] for name in ("vision_end_token", "end_of_image_token", "image_end_token") if name in ids)
    return Tokens(image=ids["image_token"], video=ids.get("video_token", -1), vision_start=start, vision_end=end,
                  video_start=ids.get("begin_of_video_token", ids.get("video_start_token")),
                  video_end=ids.get("end_of_video_token", ids.get("video_end_token")))


if __name__ == "__main__":
    main()
