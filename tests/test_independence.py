"""Whether a sample gets its positions alone wherever it stands in a batch: one decision for every
binding, third parties' included, shown on the plugin's example samples and never assumed."""

import random

import pytest
import torch

from mmrope_core import PackingUnsupportedError, PluginManager, RopeBinding, RopeEngine, hookimpl
from mmrope_core.collators import PackedCollator, PaddedCollator
from mmrope_core.reference import ReferenceKernel

pytest.importorskip("transformers")
qwen_vl_examples = pytest.importorskip("mmrope_qwen_vl.examples")


class NumberingReference(ReferenceKernel):
    """Qwen2-VL's own ``get_rope_index``, plus, at a row's image tokens, the count of the images
    of the rows before it: a reference that numbers media across the batch (as HunYuan-VL's does)."""

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        positions, deltas = super().rope_index(input_ids, attention_mask, cu_seqlens=cu_seqlens, **inputs)
        image = input_ids == self.image_token_id
        starts = image & ~torch.nn.functional.pad(image, (1, 0))[:, :-1]  # each image's first token
        before = starts.sum(1).cumsum(0) - starts.sum(1)
        positions = positions.clone()
        positions[0] += (before[:, None] * image).to(positions.dtype)
        return positions, deltas


class ThirdPartyPlugin:
    """A plugin as a third party writes it: a reference kernel of Qwen2-VL's processor, its
    inputs, and the example case it is checked on."""

    PROCESSOR_CLASSES = ("Qwen2VLProcessor",)

    def __init__(self, kernel_class, cases=True):
        self.kernel_class, self.cases = kernel_class, cases

    @hookimpl
    def bind_rope_index(self, processor, config):
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

        from mmrope_core.mrope import MropeFamily

        family = MropeFamily("Qwen2-VL", spatial_merge_size=2, image_token_id=processor.image_token_id,
                             image_key="image_grid_thw")
        kernel = self.kernel_class(Qwen2VLModel, config, token_types=family.token_types())
        kernel.image_token_id = processor.image_token_id
        return RopeBinding("mrope", kernel, "reference", "a third party's reference")

    @hookimpl
    def get_rope_index_kwargs(self, multi_modal_inputs):
        return {key: multi_modal_inputs[key] for key in ("image_grid_thw",) if key in multi_modal_inputs}

    @hookimpl
    def varlen_keys(self, processor):
        return {"mm_token_type_ids"}

    @hookimpl
    def example_cases(self):
        return qwen_vl_examples.example_cases()[:1] if self.cases else []


@pytest.fixture(scope="module")
def built():
    return qwen_vl_examples.build("Qwen2-VL")


def engine_of(built, plugin):
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "third_party"})
    manager.register(plugin, "third_party")
    processor, config = built
    return RopeEngine.from_processor(processor, config, plugin_manager=manager)


def samples_of(engine):
    rng = random.Random(3)
    samples = qwen_vl_examples.image_samples(engine.processor, rng)
    return [dict(engine.process(**sample)) for sample in samples]


def alone(engine, sample):
    ids, mask, inputs = engine.batch([sample])
    return engine.compute_position_ids(ids, mask, inputs)[0]


def test_a_reference_numbering_media_across_the_batch_is_refused_packed_and_padded_sample_by_sample(built):
    engine = engine_of(built, ThirdPartyPlugin(NumberingReference))
    assert engine.binding.kernel.samples_independent is None  # it says nothing: the core shows it
    assert engine.samples_independent is False
    samples = samples_of(engine)
    # the batch as the kernel computes it differs from the second sample alone: what is refused
    ids, mask, inputs = engine.batch(samples)
    batched = engine.compute_position_ids(ids, mask, inputs)
    second = alone(engine, samples[1])
    assert not torch.equal(batched[1][..., mask[1].bool()], second)
    with pytest.raises(PackingUnsupportedError, match="mmrope cannot show that its get_rope_index gives a sample the positions it gives it alone"):
        PackedCollator(engine)
    for side in ("right", "left"):
        batch = PaddedCollator(engine, padding_side=side)(samples)
        for row, sample in enumerate(samples):
            valid = batch["attention_mask"][row].bool()
            assert torch.equal(batch["position_ids"][:, row][..., valid], alone(engine, sample))


def test_a_reference_shown_independent_packs(built):
    engine = engine_of(built, ThirdPartyPlugin(ReferenceKernel))
    assert engine.samples_independent is True
    samples = samples_of(engine)
    batch = PackedCollator(engine)(samples)
    bounds = [0, *torch.tensor([sample["input_ids"].shape[1] for sample in samples]).cumsum(0).tolist()]
    for row, sample in enumerate(samples):
        assert torch.equal(batch["position_ids"][:, 0, bounds[row]:bounds[row + 1]], alone(engine, sample))
    padded = PaddedCollator(engine)(samples)
    for row, sample in enumerate(samples):
        valid = padded["attention_mask"][row].bool()
        assert torch.equal(padded["position_ids"][:, row][..., valid], alone(engine, sample))


def test_what_no_example_shows_is_not_assumed_and_a_kernels_own_word_is_taken(built):
    assert engine_of(built, ThirdPartyPlugin(ReferenceKernel, cases=False)).samples_independent is False

    class Declared(ReferenceKernel):
        samples_independent = True

    assert engine_of(built, ThirdPartyPlugin(Declared, cases=False)).samples_independent is True
