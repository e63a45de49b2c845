"""A plugin that breaks conformance rules: it claims every processor, changes the tensors it is
given, its positions depend on the padding side, its position_ids disagree with its rope index,
its packed positions do not restart in every segment, and its packed token types are not each
sample's own."""

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


def position_ids_counting_padding(input_ids, attention_mask=None, **kwargs):
    positions, _ = padding_dependent(input_ids)
    columns = torch.arange(input_ids.shape[1]).expand(input_ids.shape)  # the text row should hold 1 at padding
    return torch.cat([columns.unsqueeze(1), positions.transpose(0, 1)], dim=1)


def packed_ignoring_segments(input_ids, attention_mask=None, *, cu_seqlens, **kwargs):
    positions, _ = padding_dependent(input_ids)  # counts on across segment boundaries
    return positions, torch.zeros(cu_seqlens.numel() - 1, 1, dtype=torch.long)


def packed_position_ids_ignoring_segments(input_ids, attention_mask=None, *, cu_seqlens, **kwargs):
    return position_ids_counting_padding(input_ids)


def text_only(input_ids):
    return torch.zeros_like(input_ids)


def packed_token_types_with_an_image(input_ids, cu_seqlens):
    types = torch.zeros_like(input_ids)
    types[0, 0] = 1  # the row's first token, which token_types calls text
    return types


@hookimpl
def bind_rope_index(processor):
    return RopeBinding(kind="mrope", rope_index=padding_dependent, position_ids=position_ids_counting_padding,
                       packed_rope_index=packed_ignoring_segments,
                       packed_position_ids=packed_position_ids_ignoring_segments,
                       token_types=text_only, packed_token_types=packed_token_types_with_an_image)


@hookimpl
def get_rope_index_kwargs(multi_modal_inputs):
    if "pixel_values" in multi_modal_inputs:
        multi_modal_inputs["pixel_values"].mul_(0)
    return {}


@hookimpl
def example_cases():
    return [ExampleCase("Nonconforming", build=lambda: (ToyVisionProcessor(), None),
                        samples=lambda processor, rng: [{"text": ["a b"]}, {"text": ["c d e f"]}])]
