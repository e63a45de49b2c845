"""A plugin that breaks conformance rules: it claims every processor, changes the tensors it is
given, and its positions depend on the padding side."""

import torch

from mmrope_core import ExampleCase, RopeBinding, hookimpl
from mmrope_test_toy import ToyProcessor


class ToyVisionProcessor(ToyProcessor):
    def __call__(self, text, **kwargs):
        out = super().__call__(text, **kwargs)
        out["pixel_values"] = torch.ones(len(text), 2)
        return out


def padding_dependent(input_ids, attention_mask=None, **kwargs):
    columns = torch.arange(input_ids.shape[1]).expand(input_ids.shape)  # counts padding too
    return columns.unsqueeze(0).repeat(3, 1, 1), torch.zeros(input_ids.shape[0], 1, dtype=torch.long)


@hookimpl
def bind_rope_index(processor):
    return RopeBinding(kind="mrope", rope_index=padding_dependent)


@hookimpl
def get_rope_index_kwargs(multi_modal_inputs):
    if "pixel_values" in multi_modal_inputs:
        multi_modal_inputs["pixel_values"].mul_(0)
    return {}


@hookimpl
def example_cases():
    return [ExampleCase("Nonconforming", build=lambda: (ToyVisionProcessor(), None),
                        samples=lambda processor, rng: [{"text": ["a b"]}, {"text": ["c d e f"]}])]
