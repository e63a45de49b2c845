"""Plugins as a third party writes them, for Qwen2-VL's tiny processor, to show that the drop-ins
follow what an engine says of its model (``batch_layout``, ``samples_independent``) inside the
frameworks' own code: a reference that numbers images across the batch (as HunYuan-VL's does),
a model that takes only its own rows of positions, a padding side the model gets wrong."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from mmrope_core import PluginManager, RopeBinding, hookimpl
from mmrope_core.batching import COMMON, IMAGE_GRID, VIDEO_GRID, BatchLayout, MediaKey
from mmrope_core.reference import ReferenceKernel


class NumberingReference(ReferenceKernel):
    """Qwen2-VL's own ``get_rope_index``, plus, at a row's image tokens, the count of the images of
    the rows before it: what a sample gets depends on the samples before it."""

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        positions, deltas = super().rope_index(input_ids, attention_mask, cu_seqlens=cu_seqlens, **inputs)
        image = input_ids == self.image_token_id
        starts = image & ~torch.nn.functional.pad(image, (1, 0))[:, :-1]
        before = starts.sum(1).cumsum(0) - starts.sum(1)
        positions = positions.clone()
        positions[0] += (before[:, None] * image).to(positions.dtype)
        return positions, deltas


class ThirdParty:
    """Binds Qwen2-VL's processor to a reference kernel (``numbering``: one that numbers images
    across the batch) and declares ``layout`` as its model's batch layout, with its media keys ``media``."""

    #: Qwen2-VL's grids, one per image and one per video.
    MEDIA: ClassVar[dict[str, MediaKey]] = {"image_grid_thw": IMAGE_GRID, "video_grid_thw": VIDEO_GRID}

    PROCESSOR_CLASSES = ("Qwen2VLProcessor",)

    def __init__(self, *, numbering: bool = False, layout: BatchLayout | None = None,
                 media: dict[str, MediaKey] | None = None) -> None:
        self.numbering, self.layout, self.media = numbering, layout, self.MEDIA if media is None else media

    @hookimpl
    def bind_rope_index(self, processor: Any, config: Any) -> RopeBinding | None:
        if type(processor).__name__ not in self.PROCESSOR_CLASSES:
            return None
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

        from mmrope_core.mrope import MropeFamily

        family = MropeFamily("Qwen2-VL", spatial_merge_size=2, image_token_id=processor.image_token_id,
                             video_token_id=processor.video_token_id, image_key="image_grid_thw",
                             video_key="video_grid_thw")
        kernel = (NumberingReference if self.numbering else ReferenceKernel)(
            Qwen2VLModel, config, token_types=family.token_types())
        kernel.image_token_id = processor.image_token_id
        return RopeBinding("mrope", kernel, "reference", "a third party's Qwen2-VL reference")

    @hookimpl
    def get_rope_index_kwargs(self, processor: Any, multi_modal_inputs: Any) -> dict[str, Any] | None:
        if type(processor).__name__ not in self.PROCESSOR_CLASSES:
            return None
        return {key: multi_modal_inputs[key] for key in ("image_grid_thw", "video_grid_thw")
                if key in multi_modal_inputs}

    @hookimpl
    def varlen_keys(self, processor: Any) -> set[str] | None:
        return {"mm_token_type_ids"} if type(processor).__name__ in self.PROCESSOR_CLASSES else None

    @hookimpl
    def batch_layout(self, processor: Any, config: Any) -> BatchLayout | None:
        if type(processor).__name__ not in self.PROCESSOR_CLASSES:
            return None
        return (self.layout or COMMON).with_media(self.media)

    @hookimpl
    def example_cases(self) -> list[Any]:
        from mmrope_qwen_vl.examples import example_cases

        return example_cases()[:1]


def default_manager_with(monkeypatch: Any, plugin: ThirdParty) -> PluginManager:
    """The process's default plugin manager, for one test, holding only ``plugin``."""
    import mmrope_core.manager

    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "third_party"})
    manager.register(plugin, "third_party")
    monkeypatch.setattr(mmrope_core.manager, "_default_manager", manager)
    return manager
