"""What the rollout engines compute for the model types this plugin binds: the ``vllm`` and
``sglang`` conventions.

Keyed by model type because the engines dispatch that way themselves: SGLang's processors call
its ``get_rope_index`` with the config's ``model_type``, whose branches pick the rule, and vLLM
picks a model class (its ``get_mrope_input_positions``) by the checkpoint's architecture, one per
model type. Each entry was read off the engine's code and measured against transformers on
generated samples laid out as the processor lays them out, prompts and multi-turn rollouts
(``benchmarks/transformers_rollouts.py``): where an engine runs one of these model types, its
positions are transformers'. A model type the table does not name (one a later transformers
adds) has no rollout convention until it is measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from mmrope_core import InvalidInputError, RopeBinding
from mmrope_core.conventions import SGLANG_0_5_23, TRANSFORMERS, VLLM_0_33, asked, convention, described, label
from mmrope_core.kernel import RopeKernel


@dataclasses.dataclass(frozen=True)
class Transformers:
    """The engine gives every token of this model type transformers' position, prompt and decode.

    Attributes:
        videos: the engine takes videos of this model type (vLLM's Cohere-Compass takes images only:
            a sample with a video is refused, as no rollout of it exists).
        requires: ``requires(config)`` says why the engine's positions for this config are not
            transformers' (a switch of the engine's own that the config leaves off), or "".
    """

    videos: bool = True
    requires: Callable[[Any], str] | None = None


def _declares_canvas(config: Any) -> str:
    """vLLM and SGLang lay MiniCPM-V 4.7's canvas out only where the config switches it on; else
    they give every token its index on all three rows."""
    mode = str(getattr(config, "mrope_mode", "") or "").lower()
    if getattr(config, "uses_mrope_canvas", False) or "canvas" in mode:
        return ""
    return ("the config does not switch the canvas on (mrope_mode='canvas' or uses_mrope_canvas=True), so the engine "
            "gives every token its index on all three rows; pass the checkpoint's own config")


SAME = Transformers()
_NO_SGLANG_MODEL = ("SGLang 0.5.23 has no model of this type, and its Transformers backend computes M-RoPE positions "
                    "only for the model types its own get_rope_index knows")
_ORIGINAL_ERNIE = ("{engine}'s ERNIE-4.5-VL reads the original checkpoints' config ({fields}), which transformers' "
                   "ernie4_5_vl_moe config does not have: it does not run this model type")

#: model type -> the convention whose rules an engine release follows -> what it computes there,
#: or why mmrope offers no such convention for the model type.
ENGINES: Mapping[str, Mapping[str, Transformers | str]] = {
    # SGLang: get_rope_index's Qwen2.5-VL branch (images only: text resumes as in transformers); vLLM: its own model
    "paddleocr_vl": {SGLANG_0_5_23: SAME, VLLM_0_33: SAME},
    # both: Qwen3-VL's rules, each frame its own run (SGLang's images-only path too)
    "qwen4_exp": {SGLANG_0_5_23: SAME, VLLM_0_33: SAME},
    "cosmos3_omni": {SGLANG_0_5_23: SAME, VLLM_0_33: SAME},
    "cosmos3_edge": {SGLANG_0_5_23: SAME, VLLM_0_33: SAME},
    "cohere_compass": {SGLANG_0_5_23: _NO_SGLANG_MODEL, VLLM_0_33: Transformers(videos=False)},
    # both: GLM-4V's rules
    "glm_ocr": {SGLANG_0_5_23: SAME, VLLM_0_33: SAME},
    # vLLM has no model of these architectures: its Transformers backend calls the model's own get_rope_index
    "glmga": {SGLANG_0_5_23: _NO_SGLANG_MODEL, VLLM_0_33: SAME},
    "hy_v4_vl": {SGLANG_0_5_23: _NO_SGLANG_MODEL, VLLM_0_33: SAME},
    "hunyuan_vl": {
        SGLANG_0_5_23: _NO_SGLANG_MODEL,
        VLLM_0_33: "vLLM (its Transformers backend) computes each request alone, while HunYuan-VL's get_rope_index, "
                   "which mmrope runs, counts images across the batch",
    },
    "ernie4_5_vl_moe": {
        SGLANG_0_5_23: _ORIGINAL_ERNIE.format(engine="SGLang 0.5.23", fields="im_patch_id, spatial_conv_size"),
        VLLM_0_33: _ORIGINAL_ERNIE.format(engine="vLLM", fields="spatial_conv_size, temporal_conv_size"),
    },
    # prompts as transformers; generated tokens elsewhere than transformers' get_rope_index of the whole sequence
    "glm_image": {
        SGLANG_0_5_23: "SGLang 0.5.23 decodes the generated tokens on the target image's grid, laid out before "
                       "decoding, while transformers' get_rope_index of the whole sequence, which mmrope runs, places "
                       "them as text",
        VLLM_0_33: "vLLM (its Transformers backend) decodes each generated token at its index plus the prompt's delta, "
                   "which GLM-Image's get_rope_index gives as 0, while transformers' get_rope_index of the whole "
                   "sequence, which mmrope runs, counts on from the prompt's last position",
    },
    # both: their own ports of the canvas, equal to transformers' where the config switches it on
    "minicpmv4_7": {SGLANG_0_5_23: Transformers(requires=_declares_canvas),
                    VLLM_0_33: Transformers(requires=_declares_canvas)},
}


def bind_convention(binding: RopeBinding, model_type: str, config: Any, options: Mapping[str, Any]) -> RopeBinding:
    """``binding`` (transformers' positions) under the convention ``options`` ask for: itself for
    ``transformers`` and for an engine that computes transformers' positions for this model type
    (its description naming the convention); raises :class:`~mmrope_core.UnknownConventionError`
    saying why where the model type has no such convention."""
    engines = ENGINES.get(model_type, {})
    offered = [TRANSFORMERS]
    missing: dict[str, str] = {}
    for rules in (VLLM_0_33, SGLANG_0_5_23):
        found = engines.get(rules, f"mmrope has not measured {label(rules)}'s positions for model type {model_type!r}")
        why = found if isinstance(found, str) else (found.requires(config) if found.requires else "")
        if why:
            missing[rules] = why
        else:
            offered.append(rules)
    chosen = convention(options, model_type, offered, missing)
    if chosen == TRANSFORMERS:
        return binding
    computes = engines[chosen]
    assert isinstance(computes, Transformers)
    kernel = binding.kernel
    assert kernel is not None
    if not computes.videos:
        kernel = WithoutVideos(kernel, f"{label(asked(options))} takes no videos of model type {model_type!r}, so no "
                                       f"rollout holds one")
    return dataclasses.replace(binding, kernel=kernel, description=f"{binding.description}"
                               f"{described(asked(options))}: transformers' positions")


class WithoutVideos(RopeKernel):
    """``kernel``, refusing batches with videos (:class:`~mmrope_core.InvalidInputError`, ``why``)."""

    def __init__(self, kernel: RopeKernel, why: str) -> None:
        self.kernel, self.why = kernel, why
        self.position_dtype = kernel.position_dtype
        self.places_packed_rows = kernel.places_packed_rows
        self.rope_rows = kernel.rope_rows
        self.reads_generated_mask = kernel.reads_generated_mask
        self.samples_independent = kernel.samples_independent

    def __repr__(self) -> str:
        return f"WithoutVideos({self.kernel!r})"

    def __getattr__(self, name: str) -> Any:  # what else the bound kernel offers (its family, check)
        if name == "kernel":
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self._refuse_videos(input_ids, attention_mask, cu_seqlens, inputs)
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        return self.kernel.rope_index(input_ids, attention_mask, **packed, **inputs)

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> torch.Tensor:
        self._refuse_videos(input_ids, attention_mask, cu_seqlens, inputs)
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        return self.kernel.position_ids(input_ids, attention_mask, **packed, **inputs)

    def _refuse_videos(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       cu_seqlens: torch.Tensor | None, inputs: Mapping[str, Any]) -> None:
        videos = inputs.get("video_grid_thw")
        if videos is None or (isinstance(videos, torch.Tensor) and not videos.numel()):
            return
        where = ""
        token_types = getattr(self.kernel, "token_types", None)
        if token_types is not None:  # the sample holding the first video placeholder
            is_video = token_types(input_ids) == 2
            if attention_mask is not None:
                is_video &= attention_mask.bool()
            found = is_video.nonzero()
            if found.numel():
                row, column = found[0].tolist()
                sample = row if cu_seqlens is None else int((cu_seqlens[1:] <= column).sum())
                where = f"sample {sample}, "
        raise InvalidInputError(f"{where}video_grid_thw: {self.why}; compute these positions with "
                                f"convention='transformers'")
