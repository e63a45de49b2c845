"""A plugin that breaks conformance rules: it claims every processor, changes the tensors it is
given, its positions depend on the padding side, its four rows disagree with its rope index,
and its packed positions are not each sample's own (four rows counting on across segments,
three rows 1000 too high)."""

import torch
from mmrope_test_toy import ToyProcessor

from mmrope_core import ExampleCase, RopeBinding, hookimpl
from mmrope_core.kernel import RopeKernel


class ToyVisionProcessor(ToyProcessor):
    def __call__(self, text, **kwargs):
        out = super().__call__(text, **kwargs)
        out["pixel_values"] = torch.ones(len(text), 2)
        return out


class NonconformingKernel(RopeKernel):
    places_packed_rows = True
    samples_independent = True  # claimed, not kept: its positions count the padding

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        columns = torch.arange(input_ids.shape[1]).expand(input_ids.shape)  # counts padding too
        if cu_seqlens is None:
            return columns.unsqueeze(0).repeat(3, 1, 1), torch.zeros(input_ids.shape[0], 1, dtype=torch.long)
        within = torch.arange(input_ids.shape[1]) - torch.repeat_interleave(cu_seqlens[:-1], cu_seqlens.diff())
        return (within + 1000).expand(3, 1, -1).clone(), torch.zeros(cu_seqlens.numel() - 1, 1, dtype=torch.long)

    def position_ids(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        columns = torch.arange(input_ids.shape[1]).expand(input_ids.shape)  # padding counts, segments go on
        return columns.unsqueeze(1).repeat(1, 4, 1)


@hookimpl
def bind_rope_index(processor):
    return RopeBinding("mrope", NonconformingKernel(), "fast", "breaks every rule")


@hookimpl
def get_rope_index_kwargs(multi_modal_inputs):
    if "pixel_values" in multi_modal_inputs:
        multi_modal_inputs["pixel_values"].mul_(0)
    return {}


@hookimpl
def example_cases():
    return [ExampleCase("Nonconforming", build=lambda: (ToyVisionProcessor(), None),
                        samples=lambda processor, rng: [{"text": ["a b"]}, {"text": ["c d e f"]}])]
