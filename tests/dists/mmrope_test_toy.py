"""A well-behaved plugin for ToyProcessor: M-RoPE whose three rows count valid tokens, shifted
by an ``offset`` taken from the multimodal inputs."""

import torch

from mmrope_core import ExampleCase, RopeBinding, ValidationPolicy, hookimpl

PROCESSOR_CLASSES = ("ToyProcessor",)


class ToyProcessor:
    """Stands in for a processor: returns ids and a mask; rejects odd-length text when strict."""

    def __init__(self):
        self.calls = 0

    def validate_inputs(self, text=None, **kwargs):
        if any(len(sample.split()) % 2 for sample in text):
            raise ValueError("ToyProcessor wants an even number of words")

    def __call__(self, text, **kwargs):
        self.calls += 1
        self.validate_inputs(text=text)
        lengths = [len(sample.split()) for sample in text]
        longest = max(lengths)
        ids = torch.tensor([[7] * n + [0] * (longest - n) for n in lengths])
        return {"input_ids": ids, "attention_mask": (ids != 0).long()}


class Toy1dProcessor:
    pass


def toy_rope_index(input_ids, attention_mask=None, offset=0, **kwargs):
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    positions = (mask.long().cumsum(1) - 1).clamp(min=0) + int(offset)
    positions = positions.masked_fill(~mask, 0)
    deltas = torch.zeros(input_ids.shape[0], 1, dtype=torch.long)
    return positions.unsqueeze(0).repeat(3, 1, 1), deltas


def toy_position_ids(input_ids, attention_mask=None, offset=0, **kwargs):
    """The (B, 4, L) layout in one call: the text row over ``toy_rope_index``'s rows."""
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    positions, _ = toy_rope_index(input_ids, mask, offset)
    text = (mask.long().cumsum(1) - 1).masked_fill(~mask, 1)
    return torch.cat([text.unsqueeze(1), positions.transpose(0, 1)], dim=1)


def misshapen_position_ids(input_ids, attention_mask=None, **kwargs):
    return toy_rope_index(input_ids, attention_mask)[0]


POSITION_IDS = {"direct": toy_position_ids, "misshapen": misshapen_position_ids}


def toy_packed_rope_index(input_ids, attention_mask=None, *, cu_seqlens, offset=0, **kwargs):
    """One packed row: positions count from ``offset`` in every segment, as each alone."""
    lengths = cu_seqlens.diff()
    within = torch.arange(input_ids.shape[1]) - torch.repeat_interleave(cu_seqlens[:-1], lengths)
    return (within + int(offset)).expand(3, 1, -1).clone(), torch.zeros(lengths.numel(), 1, dtype=torch.long)


def misshapen_packed_rope_index(input_ids, attention_mask=None, *, cu_seqlens, **kwargs):
    return toy_rope_index(input_ids)[0][0], torch.zeros(1, 1, dtype=torch.long)


def strided_packed_rope_index(input_ids, attention_mask=None, **kwargs):
    """The same positions, laid out in memory token by token (not contiguous as (3, 1, T))."""
    positions, deltas = toy_packed_rope_index(input_ids, **kwargs)
    return positions.permute(2, 1, 0).contiguous().permute(2, 1, 0), deltas


PACKED = {"direct": toy_packed_rope_index, "misshapen": misshapen_packed_rope_index, "strided": strided_packed_rope_index}


def toy_packed_position_ids(input_ids, attention_mask=None, *, cu_seqlens, offset=0, **kwargs):
    """The (1, 4, T) layout of one packed row: each segment's count over its positions."""
    positions, _ = toy_packed_rope_index(input_ids, cu_seqlens=cu_seqlens)
    return torch.cat([positions[:1], positions + int(offset)]).transpose(0, 1)


def misshapen_packed_position_ids(input_ids, attention_mask=None, *, cu_seqlens, **kwargs):
    return toy_packed_rope_index(input_ids, cu_seqlens=cu_seqlens)[0].int()


def strided_packed_position_ids(input_ids, attention_mask=None, **kwargs):
    return toy_packed_position_ids(input_ids, **kwargs).permute(0, 2, 1).contiguous().permute(0, 2, 1)


PACKED_POSITION_IDS = {"direct": toy_packed_position_ids, "misshapen": misshapen_packed_position_ids,
                       "strided": strided_packed_position_ids}


def _relaxed(processor, text=None, **kwargs):
    if not text:
        raise ValueError("ToyProcessor needs text")


@hookimpl
def bind_rope_index(processor, options):
    if isinstance(processor, Toy1dProcessor):
        return RopeBinding(kind="1d")
    if isinstance(processor, ToyProcessor):
        return RopeBinding(kind="mrope", rope_index=toy_rope_index, implementation=options.get("impl", "fast"),
                           position_ids=POSITION_IDS.get(options.get("position_ids")),
                           packed_rope_index=PACKED.get(options.get("packed_rope_index")),
                           packed_position_ids=PACKED_POSITION_IDS.get(options.get("packed_position_ids")))
    return None


@hookimpl
def get_rope_index_kwargs(processor, multi_modal_inputs):
    if isinstance(processor, ToyProcessor) and "offset" in multi_modal_inputs:
        return {"offset": multi_modal_inputs["offset"]}
    return None


@hookimpl
def validate_inputs_policy(processor):
    if isinstance(processor, ToyProcessor):
        return ValidationPolicy(strict=False, validate=_relaxed, reason="word counts may be odd after collapsing")
    return None


@hookimpl
def varlen_keys(processor):
    if isinstance(processor, ToyProcessor):
        return ["features"]
    return None


@hookimpl
def example_cases():
    return [ExampleCase("Toy", build=lambda: (ToyProcessor(), None),
                        samples=lambda processor, rng: [{"text": ["a b"]}, {"text": ["c d e f"]}])]
