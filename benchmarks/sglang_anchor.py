"""SGLang's own M-RoPE position code, called on the CPU from an unzipped SGLang wheel (never installed).

A developer tool: it measures mmrope against the positions SGLang gives each token of a rollout.

    pip download sglang==0.5.23 --no-deps -d anchors
    python -m zipfile -e anchors/sglang-0.5.23-*.whl anchors/sglang-0.5.23
    SGLANG_SOURCE=anchors/sglang-0.5.23 python benchmarks/sglang_side_by_side.py

How it loads. ``sglang/srt/layers/rotary_embedding/mrope_rope_index.py`` (``get_rope_index``,
``get_rope_index_qwen3_omni``, ``get_rope_index_glm4v``) imports only torch and the standard
library: it is executed unchanged, as a module of its own under the wheel's file name. The rest is
read with ``ast`` from the wheel and executed unchanged, its annotations dropped (they name SGLang
types that are not loaded): ``ForwardBatch._compute_mrope_positions_extend`` and
``_compute_mrope_positions_decode`` (``model_executor/forward_batch_info.py``: the positions of the
tokens a forward pass prefills and decodes, from the request's ``mrope_positions`` and
``mrope_position_delta``), and ``QwenVLImageProcessor._compute_image_only_mrope_positions_from_offsets``
(``multimodal/processors/qwen_vl.py``: Qwen3-VL's path for prompts with images only). What this
module writes itself is only what SGLang's multimodal processors do around those calls (which
function, with which config values), and the scheduler's bookkeeping of one request (prefix and
sequence lengths), stated where it is done.

A rollout of verl's multi-turn agent loop is a sequence whose generated tokens come in runs; each
run is one request to SGLang whose prompt is every token before the run (earlier turns included,
prefilled again), then decoded token by token. :meth:`SglangAnchor.rollout` gives every token the
position it had: its request's decode positions for generated tokens, the last prefill that read
it for the others (a prefill of the whole sequence for tokens after the last run).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import os
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vllm_anchor import Tokens, _without_annotations, prompt_of

DEFAULT_SOURCE = "anchors/sglang-0.5.23"  # relative to the working directory
_ROPE_INDEX = "sglang/srt/layers/rotary_embedding/mrope_rope_index.py"
_FORWARD_BATCH = "sglang/srt/model_executor/forward_batch_info.py"
_QWEN_VL_PROCESSOR = "sglang/srt/multimodal/processors/qwen_vl.py"
_GLM_IMAGE_PROCESSOR = "sglang/srt/multimodal/processors/glm_image.py"
_MINICPMV4_7_PROCESSOR = "sglang/srt/multimodal/processors/minicpmv4_7.py"

#: the config ``model_type`` SGLang dispatches on, per family (Qwen3.5 takes Qwen3-VL's branches);
#: transformers' model types that SGLang runs through ``get_rope_index`` by their own names
MODEL_TYPES = {"Qwen2-VL": "qwen2_vl", "Qwen2.5-VL": "qwen2_5_vl", "Qwen3-VL": "qwen3_vl", "Qwen3.5": "qwen3_5",
               "GLM-4V": "glm4v", "Qwen3-Omni": "qwen3_omni_moe",
               **{name: name for name in ("paddleocr_vl", "qwen4_exp", "cosmos3_omni", "cosmos3_edge")}}
#: families whose SGLang processor is ``Glm4vImageProcessor`` (``get_rope_index_glm4v``)
GLM4V = ("GLM-4V", "glm_ocr")


@dataclasses.dataclass
class Sample:
    """One sequence as SGLang's processor hands it on: token ids and the processor outputs its
    position code reads."""

    input_ids: Sequence[int]
    image_grid_thw: Sequence[Sequence[int]] = ()
    video_grid_thw: Sequence[Sequence[int]] = ()
    second_per_grid_ts: Sequence[float] | None = None  # Qwen2.5-VL, Qwen3-Omni
    audio_feature_lengths: Sequence[int] = ()  # mel frames per audio (feature_attention_mask.sum(-1))


class SglangAnchor:
    """SGLang's position functions: ``anchor.prefill(family, sample, config, tokens)`` returns
    the request's ``mrope_positions`` and ``mrope_position_delta`` as SGLang's multimodal processor
    computes them; :meth:`rollout` every token's position in a multi-turn rollout."""

    def __init__(self, source: str | os.PathLike | None = None) -> None:
        self.source = Path(source or os.environ.get("SGLANG_SOURCE") or DEFAULT_SOURCE)
        if not (self.source / _ROPE_INDEX).is_file():
            raise FileNotFoundError(
                f"no SGLang source at {self.source}: unzip the wheel there (pip download sglang==0.5.23 --no-deps; "
                f"python -m zipfile -e sglang-*.whl {self.source}) or set SGLANG_SOURCE")
        spec = importlib.util.spec_from_file_location("sglang_anchor_mrope_rope_index", self.source / _ROPE_INDEX)
        self.rope_index = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.rope_index)
        # get_exec() is SGLang's global server state; a rollout for RL training without
        # --rl-on-policy-target leaves it None (which switches M-RoPE off)
        state = types.SimpleNamespace(deterministic=types.SimpleNamespace(rl_on_policy_target=None))
        self.forward_batch = self._methods(_FORWARD_BATCH, "ForwardBatch", (
            "_compute_mrope_positions_extend", "_compute_mrope_positions_decode", "_expand_mrope_from_input"),
            {"torch": torch, "get_exec": lambda: state})
        self.qwen_vl_processor = self._methods(_QWEN_VL_PROCESSOR, "QwenVLImageProcessor", (
            "_compute_image_only_mrope_positions_from_offsets", "_as_grid_batch"), {"torch": torch})
        self.version = _wheel_version(self.source)

    # -- one request's prompt ----------------------------------------------------------------------

    def prefill(self, family: str, sample: Sample, config: Any, tokens: Tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mrope_positions (3, L), mrope_position_delta (1, 1))`` of a request whose prompt is
        ``sample``, as SGLang's multimodal processor for the family computes them
        (``QwenVLImageProcessor._process_mm_data_uncached``, ``Glm4vImageProcessor.process_mm_data_async``)."""
        ids = torch.tensor([list(sample.input_ids)], dtype=torch.long)
        images = _grids(sample.image_grid_thw)
        videos = _grids(sample.video_grid_thw)
        if family in GLM4V:
            positions, delta = self.rope_index.get_rope_index_glm4v(
                input_ids=ids, hf_config=config, image_grid_thw=images, video_grid_thw=videos,
                attention_mask=torch.ones_like(ids))
            return positions.squeeze(1), delta
        hf_config = config.thinker_config if family == "Qwen3-Omni" else config
        seconds = None if sample.second_per_grid_ts is None else torch.tensor(sample.second_per_grid_ts,
                                                                              dtype=torch.float32)
        audio = torch.tensor(list(sample.audio_feature_lengths)) if len(sample.audio_feature_lengths) else None
        if videos is None and seconds is None and audio is None:
            found = self._images_only(family, ids, sample, hf_config, tokens)
            if found is not None:
                return found
        positions, delta = self.rope_index.get_rope_index(
            spatial_merge_size=hf_config.vision_config.spatial_merge_size, image_token_id=tokens.image,
            video_token_id=tokens.video, vision_start_token_id=tokens.vision_start, model_type=MODEL_TYPES[family],
            tokens_per_second=getattr(hf_config.vision_config, "tokens_per_second", None), input_ids=ids,
            image_grid_thw=images, video_grid_thw=videos, second_per_grid_ts=seconds, use_audio_in_video=False,
            audio_seqlens=audio, audio_token_id=tokens.audio, audio_start_token_id=tokens.audio_start,
            position_id_per_seconds=getattr(hf_config, "position_id_per_seconds", None))
        return positions.squeeze(1), delta

    def _images_only(self, family, ids, sample, hf_config, tokens):
        """The offsets path of images-only prompts (None where SGLang takes get_rope_index): each
        image item's offsets are its run of placeholder tokens, as the processor finds them."""
        runs = _token_runs(ids[0], tokens.image)
        items = [types.SimpleNamespace(offsets=[(start, end - 1)], model_specific_data={"image_grid_thw": [grid]},
                                       is_image=lambda: True)
                 for (start, end), grid in zip(runs, sample.image_grid_thw)]
        processor = types.SimpleNamespace(model_type=MODEL_TYPES[family],
                                          _spatial_merge_size=hf_config.vision_config.spatial_merge_size,
                                          _as_grid_batch=self.qwen_vl_processor._as_grid_batch)
        found = self.qwen_vl_processor._compute_image_only_mrope_positions_from_offsets(
            processor, input_len=ids.shape[1], mm_items=items, dtype=ids.dtype, device=ids.device)
        if found is None:
            return None
        positions, delta = found
        return positions.squeeze(1), delta

    def glm_image_processor(self, config: Any) -> Any:
        """``positions(input_ids (L,), image_grid_thw)``: GLM-Image's prompt positions and delta as
        its processor computes them (``GlmImageProcessor._compute_glm_image_mrope_positions``: the
        prompt's, then the target grids' decode positions, which decoding looks up by index)."""
        method = self._methods(_GLM_IMAGE_PROCESSOR, "GlmImageProcessor", ("_compute_glm_image_mrope_positions",),
                               {"torch": torch})._compute_glm_image_mrope_positions
        processor = types.SimpleNamespace(IMAGE_START_TOKEN_ID=config.image_start_token_id,
                                          IMAGE_END_TOKEN_ID=config.image_end_token_id)
        return lambda input_ids, image_grid_thw: method(processor, input_ids, image_grid_thw)

    def minicpmv4_7_processor(self, config: Any) -> Any:
        """``positions(input_ids, target_sizes)``: MiniCPM-V 4.7's prompt positions and delta as its
        processor computes them (``MiniCPMV4_7MultimodalProcessor.compute_mrope_positions``) for a
        checkpoint that declares the canvas (``mrope_mode``), its structural ids from the config;
        one item per crop (each run of placeholders), with the crop's patch grid, as
        ``MiniCPMV4_6MultimodalProcessor._build_items`` makes them."""
        source = (self.source / _MINICPMV4_7_PROCESSOR).read_text()
        scope: dict[str, Any] = {"torch": torch, "math": __import__("math"), "List": list, "Tuple": tuple,
                                 "Optional": Any, "logger": types.SimpleNamespace(warning=print)}
        tree = ast.parse(source)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) or (isinstance(node, ast.Assign) and all(
                    isinstance(target, ast.Name) and target.id.startswith("_") for target in node.targets)):
                exec(compile(ast.fix_missing_locations(ast.Module([_without_annotations(node)]
                                                                  if isinstance(node, ast.FunctionDef) else [node], [])),
                             str(self.source / _MINICPMV4_7_PROCESSOR), "exec"), scope)
        methods = self._methods(_MINICPMV4_7_PROCESSOR, "MiniCPMV4_7MultimodalProcessor",
                                ("compute_mrope_positions", "_canvas_positions"), scope)
        ids = {name: getattr(config, attribute) for name, attribute in (
            ("im_start_id", "image_start_id"), ("im_end_id", "image_end_id"), ("slice_start_id", "slice_start_id"),
            ("slice_end_id", "slice_end_id"), ("newline_id", "newline_id"))}
        processor = types.SimpleNamespace(canvas_token_ids=ids)
        processor._canvas_positions = types.MethodType(methods._canvas_positions, processor)
        image = config.image_token_id

        def positions(input_ids, target_sizes):
            runs = _token_runs(torch.tensor(list(input_ids)), image)
            items = [types.SimpleNamespace(offsets=[(start, end - 1)], tgt_size=[torch.tensor(size)])
                     for (start, end), size in zip(runs, target_sizes)]
            return methods.compute_mrope_positions(processor, list(input_ids), items)

        return positions

    # -- the forward passes of one request ---------------------------------------------------------

    def extend(self, positions: torch.Tensor, delta: torch.Tensor, length: int) -> torch.Tensor:
        """The ``(3, length)`` positions SGLang's prefill of the request's ``length`` prompt
        tokens uses (no cached prefix): ``ForwardBatch._compute_mrope_positions_extend``."""
        request = _request(positions, delta)
        batch = types.SimpleNamespace(multimodal_inputs=[request], extend_lens=[length], prefix_lens=[0],
                                      reqs=[types.SimpleNamespace(session=None)])
        forward = types.SimpleNamespace(seq_lens_cpu=torch.tensor([length]))
        self.forward_batch._compute_mrope_positions_extend(forward, types.SimpleNamespace(device="cpu"), batch)
        return forward.mrope_positions

    def decode(self, positions: torch.Tensor, delta: torch.Tensor, sequence_length: int) -> torch.Tensor:
        """The ``(3, 1)`` position of the token a decode step feeds when the request holds
        ``sequence_length`` tokens with it: ``ForwardBatch._compute_mrope_positions_decode``."""
        request = _request(positions, delta)
        batch = types.SimpleNamespace(multimodal_inputs=[request])
        lengths = torch.tensor([sequence_length])
        forward = types.SimpleNamespace(seq_lens_cpu=lengths, seq_lens=lengths)
        # positions computed beforehand (GLM-Image's target grids) are looked up by this one
        forward._expand_mrope_from_input = types.MethodType(self.forward_batch._expand_mrope_from_input, forward)
        self.forward_batch._compute_mrope_positions_decode(forward, types.SimpleNamespace(device="cpu"), batch)
        return forward.mrope_positions

    def rollout(self, family: str, sample: Sample, generated: Sequence[int], config: Any,
                tokens: Tokens) -> tuple[torch.Tensor, int]:
        """Every token's ``(3, L)`` position in a rollout of ``sample``'s tokens whose
        ``generated`` ones (1) SGLang sampled: each run of them one request, prompted with every
        token before it (with the media items there) and decoded; a prefill of the whole sequence
        for the tokens after the last run. And the delta the token after the last would be
        decoded with: the last run's request's where the sequence ends in it, else the whole
        sequence's (as decoding casts it, to int64). Raises ``ValueError`` where two requests
        prefill a token at different positions."""
        ids = list(sample.input_ids)
        starts = [i for i, flag in enumerate(generated) if flag and (i == 0 or not generated[i - 1])]
        ends = [i + 1 for i, flag in enumerate(generated) if flag and (i + 1 == len(ids) or not generated[i + 1])]
        out = torch.full((3, len(ids)), -1, dtype=torch.long)
        for start, end in [*zip(starts, ends), (len(ids), None)]:
            prompt = self.prompt_of(family, sample, start, tokens)
            positions, delta = self.prefill(family, prompt, config, tokens)
            prefilled = self.extend(positions, delta, start)
            known = (out[:, :start] >= 0).all(0) & torch.tensor([not g for g in generated[:start]], dtype=torch.bool)
            if not torch.equal(out[:, :start][:, known], prefilled[:, known]):
                raise ValueError(f"a request prompted with {start} tokens prefills earlier prompt tokens elsewhere")
            keep = out[:, :start] < 0
            out[:, :start][keep] = prefilled[keep]
            for index in range(start, end or start):
                out[:, index] = self.decode(positions, delta, index + 1)[:, 0]
            if end == len(ids) or (end is None and not generated[-1]):
                last_delta = int(self.decode(positions, delta, len(ids) + 1)[0, 0]) - len(ids)
        return out, last_delta

    def reprefilled(self, family: str, sample: Sample, generated: Sequence[int], config: Any, tokens: Tokens,
                    decoded: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """Which generated tokens a later request of the rollout (:meth:`rollout`) prefills elsewhere
        than ``decoded`` (its positions), as a bool mask; how many such placements there are (a
        token counts once per later request that prefills it elsewhere), and how many of them are
        where a prefill of the whole sequence puts the token."""
        ids = list(sample.input_ids)
        starts = [i for i, flag in enumerate(generated) if flag and (i == 0 or not generated[i - 1])]
        later = [*starts[1:], *([len(ids)] if generated and not generated[-1] else [])]
        whole, _ = self.rollout(family, sample, [0] * len(ids), config, tokens)
        moved, placements, as_whole = torch.zeros(len(ids), dtype=torch.bool), 0, 0
        for start in later:
            positions, delta = self.prefill(family, self.prompt_of(family, sample, start, tokens), config, tokens)
            prefilled = self.extend(positions, delta, start)
            elsewhere = (prefilled != decoded[:, :start]).any(0)
            elsewhere &= torch.tensor([bool(flag) for flag in generated[:start]], dtype=torch.bool)
            moved[:start] |= elsewhere
            placements += int(elsewhere.sum())
            as_whole += int((prefilled == whole[:, :start]).all(0)[elsewhere].sum())
        return moved, placements, as_whole

    prompt_of = staticmethod(prompt_of)

    # -- loading the wheel's code ------------------------------------------------------------------

    def _methods(self, path: str, class_name: str, names: Sequence[str], namespace: dict[str, Any]) -> Any:
        """The methods ``names`` of ``class_name`` in ``path``, executed unchanged (annotations
        dropped) with ``namespace`` as their globals: the only names they read besides builtins."""
        tree = ast.parse((self.source / path).read_text(), filename=str(self.source / path))
        cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name)
        found = {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name in names}
        missing = set(names) - set(found)
        if missing:
            raise LookupError(f"{path}: {class_name} has no {', '.join(sorted(missing))} (SGLang renamed it?)")
        globals_ = {"__name__": path.removesuffix(".py").replace("/", "."), **namespace}
        methods = {}
        for name, node in found.items():
            scope = dict(globals_)
            exec(compile(ast.fix_missing_locations(ast.Module([_without_annotations(node)], [])),
                         str(self.source / path), "exec"), scope)
            methods[name] = scope[name]
        return types.SimpleNamespace(**methods)


def add_anchor_arguments(parser: argparse.ArgumentParser) -> None:
    """``--source`` (SGLang's wheel) and ``--vllm-source`` (vLLM's, or 'none'), for :func:`anchors`."""
    parser.add_argument("--source", help="the unzipped SGLang wheel (default: SGLANG_SOURCE, else anchors/sglang-0.5.23)")
    parser.add_argument("--vllm-source", help="the unzipped vLLM wheel (default: VLLM_SOURCE, else "
                                              "anchors/vllm-0.33.0); 'none' leaves vLLM out")


def anchors(args: argparse.Namespace) -> tuple[SglangAnchor, Any]:
    """SGLang's anchor and vLLM's (None where ``--vllm-source none``), with a line saying which."""
    sglang = SglangAnchor(args.source)
    vllm = None
    if args.vllm_source != "none":
        from vllm_anchor import Anchor

        vllm = Anchor(args.vllm_source)
    print(f"SGLang {sglang.version} from {sglang.source}; "
          f"{f'vLLM {vllm.version} from {vllm.source}' if vllm else 'no vLLM'}; ", end="")
    return sglang, vllm


def _request(positions: torch.Tensor, delta: torch.Tensor) -> Any:
    """What ``ForwardBatch`` reads of a request's ``MultimodalInputs``."""
    return types.SimpleNamespace(mrope_positions=positions, mrope_position_delta=delta,
                                 mrope_position_delta_repeated_cache=None)


def _grids(grids: Sequence[Sequence[int]]) -> torch.Tensor | None:
    return torch.tensor([list(g) for g in grids], dtype=torch.long).reshape(-1, 3) if len(grids) else None


def _token_runs(ids: torch.Tensor, token: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of ``token``."""
    hit = (ids == token).to(torch.int8)
    edges = torch.diff(hit, prepend=torch.zeros(1, dtype=torch.int8), append=torch.zeros(1, dtype=torch.int8))
    return list(zip(torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()))


def _wheel_version(source: Path) -> str:
    for metadata in source.glob("sglang-*.dist-info/METADATA"):
        for line in metadata.read_text().splitlines():
            if line.startswith("Version: "):
                return line.removeprefix("Version: ")
    return "unknown"
