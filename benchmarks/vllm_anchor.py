"""vLLM's own M-RoPE position code, called on the CPU from an unzipped vLLM wheel (never installed).

A developer tool: it measures mmrope against the positions vLLM computes at rollout time.

    pip download vllm==0.33.0 --no-deps -d anchors
    python -m zipfile -e anchors/vllm-0.33.0-*.whl anchors/vllm-0.33.0
    VLLM_SOURCE=anchors/vllm-0.33.0 python benchmarks/vllm_side_by_side.py

How it loads. vLLM's model modules import CUDA kernels, custom ops, torch.nn layers and vLLM's
config system at module level, so they are not imported. Instead the model class's position
methods (``get_mrope_input_positions`` and every method and module-level helper it reaches, also
through base classes and other model files) are read with ``ast`` from the wheel's
``vllm/model_executor/models/<model>.py``, their annotations dropped (they name vLLM types that
are not loaded), and executed unchanged, under the wheel's file name, in one namespace per
source file. The class is rebuilt from those methods alone and given ``config``: the transformers
config vLLM holds (``hf_config``; for Omni the thinker config, as the model's ``__init__`` takes).
vLLM's input types are the real ones: ``vllm.multimodal.inputs`` (``PlaceholderRange``,
``MultiModalFeatureSpec``, ``MultiModalKwargsItems``, ``MultiModalFieldConfig``) is imported from
the wheel with three stubs: the packages ``vllm``, ``vllm.multimodal`` and ``vllm.utils`` are
bare (their ``__init__`` would start the engine), and ``vllm.multimodal.media`` holds only a
``MediaWithBytes`` type (its real module needs pybase64 and the media loaders). The items are
built as vLLM builds them: the model's own field factory (``_create_qwen2vl_field_factory``,
``create_qwen2_5_omni_thinker_field_factory``) over the processor outputs vLLM keeps, then
``MultiModalKwargsItems.from_hf_inputs``, ``argsort_mm_positions`` and ``MultiModalFeatureSpec``
as ``vllm/v1/engine/input_processor.py`` does. Only the placeholder ranges are this module's: it
reads them off the tokens, where each model's ``_get_prompt_updates`` puts them
(``PlaceholderFeaturesInfo.to_range``: offset = first token of the replacement).

Where vLLM's placeholder ranges start:
- Qwen2-VL, Qwen2.5-VL, images of every family, Omni images, videos and audios: the first
  placeholder token (the replacement is the run of placeholders; markers stay outside).
- Qwen3-VL video: the replacement is every frame's ``<t seconds>`` text, ``<|vision_start|>``,
  placeholders and ``<|vision_end|>``; the range here starts at the first frame's
  ``<|vision_start|>`` (vLLM's code finds each frame by that marker and treats the text before it
  as text either way), embeds are the video tokens.
- GLM-4V video: ``<|begin_of_video|>`` to ``<|end_of_video|>``, embeds are the frames' image tokens.
- Omni audio in video: ``<|audio_start|>`` to ``<|audio_end|>`` (inside the vision markers), for
  the video (embeds: video tokens) and for its audio (same range, embeds: audio tokens;
  ``_derive_audio_from_video_placeholders``). vLLM rejects a request with ``use_audio_in_video``
  and videos whose audios are not all inside videos (``ValueError`` there); so does this module.
  Without videos the flag changes nothing (``_maybe_apply_prompt_updates`` reads it from the videos).

vLLM's token layout for audio in video (the prompt holds ``<vision start><video><vision end>``;
vLLM drops the separate audio update and replaces the video token):
- Qwen2.5-Omni (``Qwen2_5OmniThinkerMultiModalProcessor.omni_get_updates_use_audio_in_video``):
  ``<|vision_bos|> <|audio_bos|>`` then, for each chunk c = 0 .. max(t) // n (frame times
  ``t = long(frame * second_per_grid * vision_config.tokens_per_second)``, 25 if absent;
  ``n = int(tokens_per_second * seconds_per_chunk)``): the chunk's video tokens (its frames x h x
  w / merge^2) then ``min(n, audio left)`` audio tokens; then the audio left; then
  ``<|audio_eos|> <|vision_eos|>``. A chunk without frames (frames more than n apart) still takes
  an audio chunk in the tokens, but ``_compute_interleaved_positions`` skips it, so tokens and
  positions part there. The transformers processor lays out the same chunks (video chunk j, audio
  chunk j), without the audio of empty chunks.
- Qwen3-Omni (``Qwen3OmniMoeThinkerMultiModalProcessor.get_updates_use_audio_in_video``):
  ``<|vision_start|> <|audio_start|>`` then video and audio tokens merged one by one, keyed by
  ``frame * second_per_grid * thinker position_id_per_seconds`` (float, not truncated;
  ``second_per_grid`` 2.0 if absent) against the audio index, a video token first on ties; then
  ``<|audio_end|> <|vision_end|>``. The transformers processor merges the same way but with the
  processor's ``position_id_per_seconds`` (13 by default, the thinker config's is 25), so the two
  interleave differently; vLLM's positions merge on truncated integer times, so its own tokens and
  positions part where a frame time is fractional.
Neither Omni position function reads token ids inside a run: positions follow offsets and counts.
"""

from __future__ import annotations

import ast
import builtins
import copy
import dataclasses
import functools
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

DEFAULT_SOURCE = "anchors/vllm-0.33.0"  # relative to the working directory
_MODELS = "vllm/model_executor/models"
# Modules whose names the extracted code may take from its imports; anything else is an error,
# so that a vLLM release reaching into new machinery fails loudly here.
_PLAIN_IMPORTS = ("numpy", "torch", "typing", "collections", "itertools", "functools", "math")


@dataclasses.dataclass(frozen=True)
class Family:
    module: str  # under vllm/model_executor/models, or a path from the wheel's root ending in .py
    model_class: str
    fields: tuple[str, str] = ("qwen2_vl", "_create_qwen2vl_field_factory")  # (module, factory) of its field config
    thinker: bool = False
    # (multimodal processor class, its method) laying out a video's tokens with its audio
    audio_in_video: tuple[str, str] | None = None
    # where the placeholder ranges are (see _placeholder_ranges): a family's name whose layout it
    # shares, "runs" (each run of placeholders, as many as its grid has merged patches) or "any
    # runs" (each run of placeholders, whatever its length)
    layout: str | None = None
    # attributes the model's __init__ sets, which the caller sets on the model object
    instance: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return self.module if self.module.endswith(".py") else f"{_MODELS}/{self.module}.py"


FAMILIES = {
    "Qwen2-VL": Family("qwen2_vl", "Qwen2VLForConditionalGeneration", ("qwen2_vl", "_create_qwen2vl_field_factory")),
    "Qwen2.5-VL": Family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration",
                         ("qwen2_vl", "_create_qwen2vl_field_factory")),
    "Qwen3-VL": Family("qwen3_vl", "Qwen3VLForConditionalGeneration", ("qwen2_vl", "_create_qwen2vl_field_factory")),
    "GLM-4V": Family("glm4_1v", "Glm4vForConditionalGeneration", ("qwen2_vl", "_create_qwen2vl_field_factory")),
    "Qwen2.5-Omni": Family("qwen2_5_omni_thinker", "Qwen2_5OmniThinkerForConditionalGeneration",
                           ("qwen2_5_omni_thinker", "create_qwen2_5_omni_thinker_field_factory"), thinker=True,
                           audio_in_video=("Qwen2_5OmniThinkerMultiModalProcessor",
                                           "omni_get_updates_use_audio_in_video")),
    "Qwen3-Omni": Family("qwen3_omni_moe_thinker", "Qwen3OmniMoeThinkerForConditionalGeneration",
                         ("qwen2_5_omni_thinker", "create_qwen2_5_omni_thinker_field_factory"), thinker=True,
                         audio_in_video=("Qwen3OmniMoeThinkerMultiModalProcessor", "get_updates_use_audio_in_video")),
    # model types of transformers' own that vLLM has a model of (mmrope-transformers binds them)
    "paddleocr_vl": Family("paddleocr_vl", "PaddleOCRVLForConditionalGeneration", layout="runs"),
    "qwen4_exp": Family("vllm/models/qwen4_exp/nvidia/model.py", "Qwen4ExpForConditionalGeneration",
                        layout="Qwen3-VL"),
    "cosmos3_omni": Family("cosmos3", "Cosmos3ForConditionalGeneration", layout="Qwen3-VL"),
    "cosmos3_edge": Family("cosmos3_edge", "Cosmos3EdgeForConditionalGeneration", layout="Qwen3-VL"),
    "cohere_compass": Family("cohere_compass", "CohereCompassForConditionalGeneration", layout="Qwen3-VL"),
    "glm_ocr": Family("glm_ocr", "GlmOcrForConditionalGeneration", layout="GLM-4V"),
    "minicpmv4_7": Family("minicpmv4_7", "MiniCPMV4_7ForConditionalGeneration", layout="any runs",
                          instance=("_canvas_special_ids", "_uses_canvas_mrope")),
    # vLLM's Transformers modeling backend, which serves a checkpoint whose architecture vLLM has
    # no model of: positions from the transformers model's own get_rope_index (its object is the
    # caller's, set as ``model.model``); the placeholder layout is the caller's to name
    "transformers backend": Family("transformers/multimodal", "MultiModalMixin",
                                   instance=("model", "_get_rope_index_kwarg_names")),
}


@dataclasses.dataclass(frozen=True)
class Tokens:
    """The tokenizer's ids of the placeholders and markers (None where the family has none)."""

    image: int
    video: int
    vision_start: int
    vision_end: int
    video_start: int | None = None  # GLM: <|begin_of_video|>
    video_end: int | None = None
    audio: int | None = None
    audio_start: int | None = None
    audio_end: int | None = None


@dataclasses.dataclass
class Sample:
    """One prompt as vLLM holds it: token ids and the processor outputs its position code reads."""

    input_ids: Sequence[int]
    image_grid_thw: Sequence[Sequence[int]] = ()
    video_grid_thw: Sequence[Sequence[int]] = ()
    second_per_grid_ts: Sequence[float] | None = None  # Qwen2.5-VL and Omni
    audio_feature_lengths: Sequence[int] = ()  # mel frames per audio (feature_attention_mask.sum(-1))
    use_audio_in_video: bool = False


class Anchor:
    """vLLM's position functions, one per family: ``anchor.qwen2_vl(sample, config, tokens)``
    returns vLLM's ``(3, L)`` positions and its delta."""

    def __init__(self, source: str | os.PathLike | None = None) -> None:
        self.source = Path(source or os.environ.get("VLLM_SOURCE") or DEFAULT_SOURCE)
        if not (self.source / _MODELS / "qwen2_vl.py").is_file():
            raise FileNotFoundError(
                f"no vLLM source at {self.source}: unzip the wheel there (pip download vllm==0.33.0 --no-deps; "
                f"python -m zipfile -e vllm-*.whl {self.source}) or set VLLM_SOURCE")
        self.inputs = _import_multimodal_inputs(self.source)
        self._code = _Extractor(self.source, {"vllm.multimodal.inputs": self.inputs})
        self.argsort_mm_positions = self._code.function("vllm/multimodal/utils.py", "argsort_mm_positions")
        self.version = _wheel_version(self.source)

    def qwen2_vl(self, sample: Sample, config: Any, tokens: Tokens) -> tuple[torch.Tensor, int]:
        return self.positions("Qwen2-VL", sample, config, tokens)

    def qwen2_5_vl(self, sample: Sample, config: Any, tokens: Tokens) -> tuple[torch.Tensor, int]:
        return self.positions("Qwen2.5-VL", sample, config, tokens)

    def qwen3_vl(self, sample: Sample, config: Any, tokens: Tokens) -> tuple[torch.Tensor, int]:
        return self.positions("Qwen3-VL", sample, config, tokens)

    def glm4v(self, sample: Sample, config: Any, tokens: Tokens) -> tuple[torch.Tensor, int]:
        return self.positions("GLM-4V", sample, config, tokens)

    def qwen2_5_omni(self, sample: Sample, config: Any, tokens: Tokens) -> tuple[torch.Tensor, int]:
        return self.positions("Qwen2.5-Omni", sample, config, tokens)

    def qwen3_omni(self, sample: Sample, config: Any, tokens: Tokens) -> tuple[torch.Tensor, int]:
        return self.positions("Qwen3-Omni", sample, config, tokens)

    def positions(self, family: str, sample: Sample, config: Any, tokens: Tokens, *, layout: str | None = None,
                  **instance: Any) -> tuple[torch.Tensor, int]:
        """vLLM's positions and delta of ``sample``; ``layout`` names the placeholder layout where
        the family has none of its own (the Transformers backend), ``instance`` sets the attributes
        of ``FAMILIES[family].instance``."""
        model = self.model(family, config, tokens)
        for name, value in instance.items():
            setattr(model, name, value)
        features = self.features(family, sample, config, tokens, layout=layout)
        return model.get_mrope_input_positions(list(sample.input_ids), features)

    def minicpmv4_7_positions(self, sample: Sample, config: Any, tokens: Tokens, target_sizes: Sequence[Sequence[int]],
                              **instance: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """MiniCPM-V 4.7's positions and delta: one feature per crop (each run of placeholders, in
        order), holding the crop's patch grid as ``tgt_sizes``, which the position code reads in
        the features' order (the features' grouping into images does not change them)."""
        model = self.model("minicpmv4_7", config, tokens)
        for name, value in instance.items():
            setattr(model, name, value)
        ids = torch.as_tensor(list(sample.input_ids))
        features = [types.SimpleNamespace(data={"tgt_sizes": types.SimpleNamespace(data=torch.tensor([list(size)]))},
                                          mm_position=self.inputs.PlaceholderRange(start, end - start),
                                          modality="image")
                    for (start, end), size in zip(_token_runs(ids, tokens.image), target_sizes)]
        positions, delta = model.get_mrope_input_positions(list(sample.input_ids), features)
        return torch.as_tensor(positions), torch.tensor([[int(delta)]])

    def decode(self, delta: int, context_len: int, count: int) -> torch.Tensor:
        """The ``(3, count)`` positions of ``count`` tokens decoded after ``context_len`` tokens of
        a request whose prompt has ``delta``: vLLM 0.33's ``MRotaryEmbedding.get_next_input_positions_tensor``,
        or where a release has none, the Triton kernel of its model runner that writes every step's
        positions (0.34: ``_prepare_rope_positions_kernel``), run in Python (see :class:`_Triton`)."""
        out = torch.zeros(3, count, dtype=torch.int64).numpy()
        try:
            cls = self._code.model_class(_MROPE, "MRotaryEmbedding", roots=("get_next_input_positions_tensor",))
        except LookupError:
            kernel = self._code.function(_ROPE_STATE, "_prepare_rope_positions_kernel", {"tl": _Triton})
            positions = np.zeros((3, count + 1), dtype=np.int64)  # (one dummy position, as vLLM's)
            prefill = np.zeros((3, max(context_len, 1)), dtype=np.int32)
            _Triton.launch(kernel, 1, _Pointer(positions), positions.shape[1], _Pointer(prefill), 3 * prefill.shape[1],
                           prefill.shape[1], _Pointer(np.array([delta], dtype=np.int32)), _Pointer(np.array([0])),
                           _Pointer(np.array([0, count])), _Pointer(np.array([context_len])),
                           _Pointer(np.array([context_len])), BLOCK_SIZE=1024, NUM_DIMS=3)
            return torch.from_numpy(positions[:, :count])
        cls.get_next_input_positions_tensor(out, 0, int(delta), context_len, count)
        return torch.from_numpy(out)

    def rollout(self, family: str, sample: Sample, generated: Sequence[int], config: Any,
                tokens: Tokens) -> tuple[torch.Tensor, int]:
        """Every token's ``(3, L)`` position in a rollout of ``sample``'s tokens whose ``generated``
        ones (1) vLLM sampled: each run of them one request, prompted with every token before it
        (with the media items there) and decoded (:meth:`decode`); the tokens after the last run
        as a prefill of the whole sequence places them. And the delta the token after the last
        would be decoded with. Raises ``ValueError`` where two requests prefill a token at
        different positions."""
        ids = list(sample.input_ids)
        starts = [i for i, flag in enumerate(generated) if flag and (i == 0 or not generated[i - 1])]
        out = torch.full((3, len(ids)), -1, dtype=torch.long)
        last_delta = None
        for start in [*starts, len(ids)]:
            positions, delta = self.positions(family, prompt_of(family, sample, start, tokens), config, tokens)
            prefilled = torch.as_tensor(positions).to(torch.long)
            known = (out[:, :start] >= 0).all(0) & torch.tensor([not g for g in generated[:start]], dtype=torch.bool)
            if not torch.equal(out[:, :start][:, known], prefilled[:, known]):
                raise ValueError(f"a request prompted with {start} tokens prefills earlier prompt tokens elsewhere")
            out[:, :start] = torch.where(out[:, :start] < 0, prefilled, out[:, :start])
            end = start
            while end < len(ids) and generated[end]:
                end += 1
            if end > start:
                out[:, start:end] = self.decode(int(delta), start, end - start)
            if end == len(ids) and last_delta is None:
                last_delta = int(delta)
        return out, last_delta

    def audio_in_video_tokens(self, family: str, config: Any, tokens: Tokens, audio_tokens: int,
                              grid: Sequence[int], second_per_grid: float | None) -> list[int]:
        """vLLM's own token layout of a video with its audio: what its prompt update puts in place
        of the video token, ``<audio start> ... <audio end>`` (the vision markers stay around it),
        built by the family's multimodal processor method, called as ``_get_prompt_updates`` calls
        it (the grid a tensor row, the seconds a float of the float32 tensor, else its default)."""
        spec = FAMILIES[family]
        if spec.audio_in_video is None:
            raise LookupError(f"{family} lays out no video with its audio")
        class_name, method = spec.audio_in_video
        cls = self._code.model_class(spec.path, class_name, roots=(method,))
        if second_per_grid is None:
            second_per_grid = 2.0 if family == "Qwen3-Omni" else 1.0
        else:
            second_per_grid = torch.tensor([second_per_grid], dtype=torch.float32)[0].item()
        updates = getattr(object.__new__(cls), method)(
            thinker_config=_hf_config(config, tokens, True), audio_len=int(audio_tokens),
            video_grid_thw=torch.tensor(list(grid), dtype=torch.long), video_second_per_grid_t=second_per_grid)
        return [int(token) for token in updates]

    def model(self, family: str, config: Any, tokens: Tokens) -> Any:
        """The model object vLLM calls, with only its position methods and ``config`` (and the
        attributes of ``FAMILIES[family].instance`` for the caller to set)."""
        spec = FAMILIES[family]
        cls = self._code.model_class(spec.path, spec.model_class, instance=spec.instance)
        model = object.__new__(cls)
        model.config = _hf_config(config, tokens, spec.thinker)
        return model

    def features(self, family: str, sample: Sample, config: Any, tokens: Tokens, *, layout: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> list[Any]:
        """``mm_features`` as vLLM's input processor hands them to the model runner (``extra``:
        further processor outputs, batched per image)."""
        spec = FAMILIES[family]
        hf_config = _hf_config(config, tokens, spec.thinker)
        merge = int(getattr(hf_config.vision_config, "spatial_merge_size", 1) or 1)
        hf_inputs, placeholders = self._processor_outputs(family, sample, tokens, merge,
                                                          layout or spec.layout or family)
        factory = self._code.function(f"{_MODELS}/{spec.fields[0]}.py", spec.fields[1])
        fields = dict(factory(merge)(hf_inputs))
        if family == "Qwen2.5-VL":  # Qwen2_5_VLMultiModalProcessor._get_mm_fields_config adds it
            fields["second_per_grid_ts"] = self.inputs.MultiModalFieldConfig.batched("video", keep_on_cpu=True)
        items = self.inputs.MultiModalKwargsItems.from_hf_inputs(hf_inputs, fields)
        return [
            self.inputs.MultiModalFeatureSpec(data=items[modality][index], modality=modality,
                                              identifier=f"{modality}-{index}",
                                              mm_position=placeholders[modality][index])
            for modality, index in self.argsort_mm_positions(placeholders)
        ]

    def _processor_outputs(self, family: str, sample: Sample, tokens: Tokens, merge: int, layout: str):
        from transformers.feature_extraction_utils import BatchFeature

        ids = torch.as_tensor(list(sample.input_ids))
        ranges = _placeholder_ranges(layout, ids, sample, tokens, merge)
        range_class = self.inputs.PlaceholderRange
        placeholders = {modality: [range_class(offset, length, is_embed) for offset, length, is_embed in found]
                        for modality, found in ranges.items() if found}
        data: dict[str, Any] = {}
        if len(sample.image_grid_thw):
            data["image_grid_thw"] = torch.as_tensor(sample.image_grid_thw, dtype=torch.long).reshape(-1, 3)
        if len(sample.video_grid_thw):
            data["video_grid_thw"] = torch.as_tensor(sample.video_grid_thw, dtype=torch.long).reshape(-1, 3)
            if sample.second_per_grid_ts is not None and family != "Qwen2-VL":  # Qwen2-VL's processor has none
                data["second_per_grid_ts"] = torch.as_tensor(sample.second_per_grid_ts, dtype=torch.float32)
        if FAMILIES[family].thinker:
            # Qwen2_5OmniThinkerMultiModalProcessor._postprocess_hf_mm_data
            if len(sample.audio_feature_lengths):
                data["audio_feature_lengths"] = torch.as_tensor(sample.audio_feature_lengths, dtype=torch.long)
            data["use_audio_in_video"] = torch.tensor(bool(sample.use_audio_in_video))
        return BatchFeature(data), placeholders


def prompt_of(family: str, sample: Any, length: int, tokens: Tokens) -> Any:
    """The first ``length`` tokens of ``sample`` (this module's :class:`Sample` or another
    dataclass with its fields) with the media items they hold (items begin with a start marker;
    GLM's videos with their begin-of-video marker, Omni's videos with their audio with an audio
    start inside the vision start)."""
    ids = list(sample.input_ids)[:length]
    follows = [ids[i + 1] if i + 1 < len(ids) else None for i, token in enumerate(ids)
               if token == tokens.vision_start]
    if tokens.video_start is not None:  # GLM: images outside video markers, videos by their marker
        inside, images = 0, 0
        for i, token in enumerate(ids):
            inside += (token == tokens.video_start) - (token == tokens.video_end)
            images += token == tokens.image and not inside and (i == 0 or ids[i - 1] != tokens.image)
        videos = ids.count(tokens.video_start)
    else:
        images = follows.count(tokens.image)
        # Qwen3-VL writes a vision start before every frame of a video
        runs = follows.count(tokens.video) + (follows.count(tokens.audio_start) if tokens.audio_start is not None else 0)
        videos = 0
        for grid in sample.video_grid_thw:
            runs -= grid[0] if family in ("Qwen3-VL", "Qwen3.5") else 1
            if runs < 0:
                break
            videos += 1
    seconds = None if sample.second_per_grid_ts is None else list(sample.second_per_grid_ts)[:videos]
    audios = ids.count(tokens.audio_start) if tokens.audio_start is not None else 0
    return dataclasses.replace(sample, input_ids=ids, image_grid_thw=list(sample.image_grid_thw)[:images],
                               video_grid_thw=list(sample.video_grid_thw)[:videos], second_per_grid_ts=seconds,
                               audio_feature_lengths=list(sample.audio_feature_lengths)[:audios])


def _wheel_version(source: Path) -> str:
    for metadata in source.glob("vllm-*.dist-info/METADATA"):
        for line in metadata.read_text().splitlines():
            if line.startswith("Version: "):
                return line.removeprefix("Version: ")
    return "unknown"


def _hf_config(config: Any, tokens: Tokens, thinker: bool) -> Any:
    """The config vLLM's model holds, with the tokenizer's ids (a checkpoint's config has them)."""
    config = copy.copy(getattr(config, "thinker_config", config) if thinker else config)
    for name, value in (("image_token_id", tokens.image), ("video_token_id", tokens.video),
                        ("vision_start_token_id", tokens.vision_start), ("vision_end_token_id", tokens.vision_end),
                        ("audio_token_id", tokens.audio), ("audio_start_token_id", tokens.audio_start),
                        ("audio_end_token_id", tokens.audio_end)):
        if value is not None:
            setattr(config, name, value)
    return config


def _placeholder_ranges(family: str, ids: torch.Tensor, sample: Sample, tokens: Tokens, merge: int):
    """``modality -> [(offset, length, is_embed)]`` where vLLM's prompt updates put each item
    (``family``: the layout, see :class:`Family`)."""
    per_grid = [int(torch.tensor(g).prod()) // merge**2 for g in sample.image_grid_thw]
    per_video = [int(torch.tensor(g).prod()) // merge**2 for g in sample.video_grid_thw]
    found: dict[str, list] = {"image": [], "video": [], "audio": []}
    if family == "GLM-4V":
        video_at = _runs(ids, tokens.video_start, tokens.video_end)
        for offset, end in video_at:
            span = ids[offset:end + 1]
            found["video"].append((offset, end + 1 - offset, span == tokens.image))
        inside = torch.zeros_like(ids, dtype=torch.bool)
        for offset, end in video_at:
            inside[offset:end + 1] = True
        found["image"] = [(a, b - a, None) for a, b in _token_runs(ids, tokens.image, ~inside)]
    elif family == "Qwen3-VL":
        found["image"] = [(a, b - a, None) for a, b in _token_runs(ids, tokens.image)]
        frames = _token_runs(ids, tokens.video)
        for grid in sample.video_grid_thw:
            taken, frames = frames[:grid[0]], frames[grid[0]:]
            offset, end = taken[0][0] - 1, taken[-1][1] + 1  # first frame's vision start .. last vision end
            found["video"].append((offset, end - offset, ids[offset:end] == tokens.video))
    elif family in FAMILIES and FAMILIES[family].thinker and sample.use_audio_in_video and len(sample.video_grid_thw):
        found["image"] = [(a, b - a, None) for a, b in _token_runs(ids, tokens.image)]
        for offset, end in _runs(ids, tokens.audio_start, tokens.audio_end):
            if offset == 0 or int(ids[offset - 1]) != tokens.vision_start:
                raise ValueError("use_audio_in_video: vLLM takes no audio outside videos "
                                 "(Qwen2_5OmniThinkerMultiModalProcessor._derive_audio_from_video_placeholders)")
            span = ids[offset:end + 1]
            found["video"].append((offset, end + 1 - offset, span == tokens.video))
            found["audio"].append((offset, end + 1 - offset, span == tokens.audio))
    else:
        for modality, token in (("image", tokens.image), ("video", tokens.video), ("audio", tokens.audio)):
            if token is not None:
                found[modality] = [(a, b - a, None) for a, b in _token_runs(ids, token)]
    for modality, sizes in (("image", per_grid), ("video", per_video)):
        if (family in ("Qwen3-VL", "GLM-4V") and modality == "video") or family == "any runs":
            continue
        got = [int(length if embed is None else embed.sum()) for _, length, embed in found[modality]]
        if got != sizes:
            raise ValueError(f"{family}: {modality} placeholder runs {got} do not match the grids {sizes}")
    return found


def _token_runs(ids: torch.Tensor, token: int, where: torch.Tensor | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of ``token``."""
    hit = ids == token if where is None else (ids == token) & where
    edges = torch.diff(hit.to(torch.int8), prepend=torch.zeros(1, dtype=torch.int8),
                       append=torch.zeros(1, dtype=torch.int8))
    return list(zip(torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()))


def _runs(ids: torch.Tensor, start: int, end: int) -> list[tuple[int, int]]:
    """``(start marker, end marker)`` index pairs, inclusive."""
    starts = torch.nonzero(ids == start).flatten().tolist()
    ends = torch.nonzero(ids == end).flatten().tolist()
    return list(zip(starts, ends))


# -- loading the wheel's code ---------------------------------------------------------------------


def _import_multimodal_inputs(source: Path) -> types.ModuleType:
    if "vllm" in sys.modules and getattr(sys.modules["vllm"], "__path__", [None])[0] != str(source / "vllm"):
        raise RuntimeError("another vllm is imported in this process; run the anchor in a process of its own")
    for name in ("vllm", "vllm.multimodal", "vllm.utils"):
        if name not in sys.modules:
            path = str(source.joinpath(*name.split(".")))
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [path]
            package = importlib.util.module_from_spec(spec)
            package.__path__ = [path]
            sys.modules[name] = package
    media = types.ModuleType("vllm.multimodal.media")
    media.MediaWithBytes = _MediaWithBytes
    sys.modules.setdefault(media.__name__, media)
    return importlib.import_module("vllm.multimodal.inputs")


_T = typing.TypeVar("_T")


class _MediaWithBytes(typing.Generic[_T]):
    """Stands for vllm.multimodal.media.MediaWithBytes, which inputs.py names only in type aliases."""


class _Extractor:
    """Functions and classes read from the wheel's source files and executed without their imports."""

    def __init__(self, source: Path, modules: Mapping[str, types.ModuleType]) -> None:
        self.source = source
        self.modules = modules
        self.namespaces: dict[str, dict[str, Any]] = {}

    @functools.cache
    def _tree(self, path: str) -> ast.Module:
        return ast.parse((self.source / path).read_text(), filename=str(self.source / path))

    def _namespace(self, path: str) -> dict[str, Any]:
        return self.namespaces.setdefault(path, {"__name__": path.removesuffix(".py").replace("/", "."),
                                                 "__builtins__": builtins})

    def function(self, path: str, name: str, names: Mapping[str, Any] | None = None) -> Any:
        """The module-level function ``name`` of ``path``, with what it uses (``names`` stand
        for modules that are not loaded)."""
        namespace = self._namespace(path)
        namespace.update(names or {})
        if name not in namespace:
            node = self._top_level(path, name)
            if not isinstance(node, ast.FunctionDef):
                raise LookupError(f"{path}: {name} is not a function")
            self._execute(path, node, namespace)
        return namespace[name]

    @functools.cache
    def model_class(self, path: str, name: str, roots: tuple[str, ...] = ("get_mrope_input_positions",),
                    instance: tuple[str, ...] = ()) -> type:
        """A class named ``name`` holding the position methods of ``path``'s class of that name:
        ``roots`` and every method they reach through ``self``/the class, but for ``instance``:
        attributes its ``__init__`` sets (the caller sets them on the object)."""
        methods: dict[str, Any] = {}
        wanted = list(roots)
        while wanted:
            method = wanted.pop()
            if method in methods or method in instance:
                continue
            where, node = self._method(path, name, method)
            namespace = self._namespace(where)
            self._execute(where, node, namespace, class_name=name)
            methods[method] = namespace.pop(method)
            wanted += _attributes_of(node, ("self", name))
        cls = type(name, (), methods)
        for namespace in self.namespaces.values():
            if namespace.get(name, cls) is _PENDING:
                namespace[name] = cls
        return cls

    def _method(self, path: str, class_name: str, method: str) -> tuple[str, ast.FunctionDef]:
        """Where ``method`` is defined for ``class_name``: the class, else its bases, depth first."""
        node = self._top_level(path, class_name)
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == method:
                return path, item
        for base in node.bases:
            if isinstance(base, ast.Name):
                where = self._defined_in(path, base.id)
                if where is not None and isinstance(self._top_level(where, base.id), ast.ClassDef):
                    try:
                        return self._method(where, base.id, method)
                    except LookupError:
                        pass
        raise LookupError(f"{path}: {class_name} has no method {method} (vLLM renamed it?)")

    def _top_level(self, path: str, name: str) -> ast.AST:
        for node in self._tree(path).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return node
        raise LookupError(f"{path}: no top-level {name}")

    def _defined_in(self, path: str, name: str) -> str | None:
        """The source file defining ``name`` as seen from ``path``: itself or a vLLM module it imports from."""
        for node in self._tree(path).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                return path
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                module = self._module_path(path, node)
                return module if module and (self.source / module).is_file() else None
        return None

    def _module_path(self, path: str, node: ast.ImportFrom) -> str | None:
        if node.level:
            base = Path(path).parent
            for _ in range(node.level - 1):
                base = base.parent
            return str(base / (node.module or "").replace(".", "/")) + ".py"
        if node.module and node.module.startswith("vllm."):
            return node.module.replace(".", "/") + ".py"
        return None

    def _execute(self, path: str, node: ast.FunctionDef, namespace: dict[str, Any], class_name: str = "") -> None:
        node = _without_annotations(node)
        for free in sorted(_names_of(node) - set(dir(builtins)) - set(namespace)):
            if free == class_name:
                namespace[free] = _PENDING  # bound to the rebuilt class once it exists
            elif (where := self._class_defined(path, free)) is not None:
                # another model's class whose static methods this one calls (Cosmos3-Edge: Qwen3-VL's)
                namespace[free] = self.model_class(where, free, roots=tuple(_attributes_of(node, (free,))))
            elif (value := self._resolve(path, free)) is not _MISSING:
                namespace[free] = value
        exec(compile(ast.fix_missing_locations(ast.Module([node], [])), str(self.source / path), "exec"), namespace)

    def _class_defined(self, path: str, name: str) -> str | None:
        """The source file of the class ``name`` seen from ``path``, or None where it names no class."""
        for node in self._tree(path).body:
            if isinstance(node, ast.ImportFrom) and node.module in self.modules and any(
                    (alias.asname or alias.name) == name for alias in node.names):
                return None  # a vLLM module loaded as it is
        where = self._defined_in(path, name)
        if where is None:
            return None
        try:
            node = self._top_level(where, name)
        except LookupError:
            return None
        if not isinstance(node, ast.ClassDef) or _is_record(node):
            return None
        return where

    def _resolve(self, path: str, name: str) -> Any:
        """What ``name`` means in ``path``: a plain import, a vLLM module we load, or a function of
        the wheel. Names that are none of these are locals of the function (ast cannot tell)."""
        for node in self._tree(path).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return self.function(path, name)
            if isinstance(node, ast.ClassDef) and node.name == name and _is_record(node):
                return self._record(path, node)
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                if name == "logger":  # init_logger(__name__), vLLM's
                    return logging.getLogger(path)
                scope: dict[str, Any] = {"__builtins__": builtins}
                for free in _names_of(node.value) - set(dir(builtins)):
                    if (value := self._resolve(path, free)) is not _MISSING:
                        scope[free] = value
                exec(compile(ast.fix_missing_locations(ast.Module([node], [])), str(self.source / path), "exec"), scope)
                return scope[name]
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if (alias.asname or alias.name.split(".")[0]) == name:
                        if alias.name.split(".")[0] not in _PLAIN_IMPORTS:
                            raise ImportError(f"{path}: the position code uses {name} ({alias.name}), not loaded")
                        module = importlib.import_module(alias.name)
                        return module if alias.asname else importlib.import_module(alias.name.split(".")[0])
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) != name:
                        continue
                    module = node.module or ""
                    if not node.level and module.split(".")[0] in _PLAIN_IMPORTS:
                        return getattr(importlib.import_module(module), alias.name)
                    if not node.level and module in self.modules:
                        return getattr(self.modules[module], alias.name)
                    where = self._module_path(path, node)
                    if where and (self.source / where).is_file():
                        return self.function(where, alias.name)
                    raise ImportError(f"{path}: the position code uses {name} from {module}, not loaded")
        return _MISSING


    @functools.cache
    def _record(self, path: str, node: ast.ClassDef) -> type:
        """A ``NamedTuple`` class of the wheel, executed as it is (its fields are its annotations)."""
        scope: dict[str, Any] = {"__builtins__": builtins, "__name__": path.removesuffix(".py").replace("/", ".")}
        for free in _names_of(node) - set(dir(builtins)):
            if (value := self._resolve(path, free)) is not _MISSING:
                scope[free] = value
        exec(compile(ast.fix_missing_locations(ast.Module([node], [])), str(self.source / path), "exec"), scope)
        return scope[node.name]


def _is_record(node: ast.ClassDef) -> bool:
    return any(isinstance(base, ast.Name) and base.id == "NamedTuple" for base in node.bases)


_MISSING = object()
_PENDING = object()
_MROPE = "vllm/model_executor/layers/rotary_embedding/mrope.py"
_ROPE_STATE = "vllm/v1/worker/gpu/mm/rope.py"


class _Pointer:
    """A Triton pointer into a numpy array: the array and an offset (a number or an array of them)."""

    def __init__(self, array: Any, offset: Any = 0) -> None:
        self.array, self.offset = array.reshape(-1), offset

    def __add__(self, other: Any) -> _Pointer:
        return _Pointer(self.array, self.offset + other)

    __radd__ = __add__


class _Triton:
    """The parts of ``triton.language`` a kernel of plain loads, stores and ranges uses, in numpy:
    :meth:`launch` runs the kernel once per program, each seeing its ``program_id``."""

    constexpr = int
    _program = 0

    @staticmethod
    def program_id(axis: int) -> int:
        return _Triton._program

    @staticmethod
    def arange(start: int, end: int) -> Any:
        return np.arange(start, end)

    @staticmethod
    def static_range(*bounds: int) -> range:
        return range(*bounds)

    @staticmethod
    def load(pointer: _Pointer, mask: Any = None) -> Any:
        if mask is None:
            return pointer.array[pointer.offset]
        return np.where(mask, pointer.array[np.where(mask, pointer.offset, 0)], 0)

    @staticmethod
    def store(pointer: _Pointer, value: Any, mask: Any = None) -> None:
        where = np.broadcast_to(True if mask is None else mask, np.shape(pointer.offset))
        pointer.array[np.asarray(pointer.offset)[where]] = np.broadcast_to(value, where.shape)[where]

    @staticmethod
    def launch(kernel: Any, programs: int, *args: Any, **constants: Any) -> None:
        for program in range(programs):
            _Triton._program = program
            kernel(*args, **constants)


def _without_annotations(node: ast.FunctionDef) -> ast.FunctionDef:
    """A copy without annotations (they name vLLM types that are not loaded) and without
    decorators other than ``staticmethod``/``classmethod``."""
    node = _DropAnnotations().visit(copy.deepcopy(node))
    node.decorator_list = [d for d in node.decorator_list if isinstance(d, ast.Name) and d.id in ("staticmethod",
                                                                                                    "classmethod")]
    return node


class _DropAnnotations(ast.NodeTransformer):
    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=self.visit(node.value)), node)


def _names_of(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _attributes_of(node: ast.AST, owners: tuple[str, ...]) -> list[str]:
    """Attributes read from ``self`` or the class itself: the methods a method calls."""
    return [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in owners and n.attr != "config"]
