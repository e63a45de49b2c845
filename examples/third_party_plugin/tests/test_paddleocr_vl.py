"""The third-party plugin, installed as a distribution, found through its entry point."""

import random

import importlib_metadata
import torch

from mmrope_core import PluginManager, RopeEngine
from mmrope_core.testing import assert_conforms


def test_it_is_an_installed_distribution_with_an_entry_point():
    entry_points = {ep.name: ep for ep in importlib_metadata.entry_points(group="mmrope")}
    assert entry_points["paddleocr_vl"].dist.metadata["Name"] == "mmrope-paddleocr-vl"


def test_positions_equal_the_models_own_get_rope_index():
    from transformers.models.paddleocr_vl.modeling_paddleocr_vl import PaddleOCRVLModel

    import mmrope_paddleocr_vl
    from mmrope_core.reference import config_only_model

    processor, config = mmrope_paddleocr_vl.build()
    engine = RopeEngine.from_processor(processor, config, plugin_manager=PluginManager(env={"MMROPE_LOAD_PLUGINS": "paddleocr_vl"}))
    assert engine.plugin_name == "paddleocr_vl" and engine.implementation == "fast"
    model = config_only_model(PaddleOCRVLModel, config)
    for seed in range(5):
        samples = mmrope_paddleocr_vl.image_samples(processor, random.Random(seed))
        for side in ("left", "right"):
            ids, mask, inputs = engine.batch([processor(**sample) for sample in samples], side)
            token_types = (ids == processor.image_token_id).long()  # the processor's, aligned with this padding
            want, want_deltas = model.get_rope_index(input_ids=ids, mm_token_type_ids=token_types,
                                                     image_grid_thw=inputs["image_grid_thw"], attention_mask=mask)
            got, deltas = engine.get_rope_index(ids, mask, image_grid_thw=inputs["image_grid_thw"])
            assert torch.equal(got, want) and torch.equal(deltas, want_deltas)


def test_it_passes_the_conformance_suite():
    assert_conforms("paddleocr_vl")
