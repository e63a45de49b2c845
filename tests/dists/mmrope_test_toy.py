"""A well-behaved plugin for ToyProcessor: M-RoPE whose three rows count valid tokens, shifted
by an ``offset`` taken from the multimodal inputs."""

import torch

from mmrope_core import ExampleCase, RopeBinding, ValidationPolicy, hookimpl
from mmrope_core.kernel import RopeKernel

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


class ToyKernel(RopeKernel):
    """Three rows counting each sample's valid tokens from ``offset`` (0 at padding); packed
    rows restart in every segment. Records the layouts it is called on."""

    samples_independent = True  # every row computed alike, as the toy's conformance checks show

    def __init__(self, places_packed_rows=False):
        self.places_packed_rows = places_packed_rows
        self.calls = []
        self.ignored = []  # the keyword arguments of each call it does not take

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, offset=0, **ignored):
        self.calls.append(("rope_index", None if cu_seqlens is None else cu_seqlens.tolist(), attention_mask))
        self.ignored.append(sorted(ignored))
        return toy_rope_index(input_ids, attention_mask, cu_seqlens, offset)


class DecodingKernel(ToyKernel):
    """Takes ``generated_mask``: the toy's positions plus 1000 at generated tokens. Records the
    masks it is given."""

    reads_generated_mask = True

    def __init__(self, places_packed_rows=False):
        super().__init__(places_packed_rows)
        self.generated = []

    def rope_index(self, input_ids, attention_mask=None, *, generated_mask=None, **kwargs):
        self.generated.append(generated_mask)
        positions, deltas = super().rope_index(input_ids, attention_mask, **kwargs)
        return (positions if generated_mask is None else positions + 1000 * generated_mask), deltas


def toy_rope_index(input_ids, attention_mask=None, cu_seqlens=None, offset=0):
    if cu_seqlens is not None:
        lengths = cu_seqlens.diff()
        within = torch.arange(input_ids.shape[1]) - torch.repeat_interleave(cu_seqlens[:-1], lengths)
        return (within + int(offset)).expand(3, 1, -1).clone(), torch.zeros(lengths.numel(), 1, dtype=torch.long)
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    positions = (mask.long().cumsum(1) - 1).clamp(min=0) + int(offset)
    positions = positions.masked_fill(~mask, 0)
    return positions.unsqueeze(0).repeat(3, 1, 1), torch.zeros(input_ids.shape[0], 1, dtype=torch.long)


class DirectKernel(ToyKernel):
    """Writes the four rows itself, as the default would."""

    def position_ids(self, input_ids, attention_mask=None, *, cu_seqlens=None, offset=0, **ignored):
        self.calls.append(("position_ids", None if cu_seqlens is None else cu_seqlens.tolist(), attention_mask))
        positions, _ = toy_rope_index(input_ids, attention_mask, cu_seqlens, offset)
        if cu_seqlens is None:
            mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
            text = (mask.long().cumsum(1) - 1).masked_fill(~mask, 1)
        else:
            text = positions[0] - int(offset)
        return torch.cat([text.unsqueeze(1), positions.transpose(0, 1)], dim=1)


class MisshapenKernel(ToyKernel):
    """Positions without their batch dimension, deltas of one row, four rows without the text row."""

    def rope_index(self, input_ids, attention_mask=None, **kwargs):
        return super().rope_index(input_ids, attention_mask, **kwargs)[0][0], torch.zeros(1, 1, dtype=torch.long)

    def position_ids(self, input_ids, attention_mask=None, **kwargs):
        return super().rope_index(input_ids, attention_mask, **kwargs)[0].transpose(0, 1)


class Int32Kernel(DirectKernel):
    def position_ids(self, *args, **kwargs):
        return super().position_ids(*args, **kwargs).int()


class HalfKernel(ToyKernel):
    """Positions in half precision, deltas as bools: neither holds positions exactly."""

    def rope_index(self, *args, **kwargs):
        positions, deltas = super().rope_index(*args, **kwargs)
        return positions.half(), deltas.bool()


class ElsewhereKernel(DirectKernel):
    """Right shapes and dtypes, on another device than the tokens."""

    def rope_index(self, *args, **kwargs):
        return tuple(result.to("meta") for result in super().rope_index(*args, **kwargs))

    def position_ids(self, *args, **kwargs):
        return super().position_ids(*args, **kwargs).to("meta")


class StridedKernel(DirectKernel):
    """The same positions, laid out in memory token by token (not contiguous)."""

    def rope_index(self, *args, **kwargs):
        positions, deltas = super().rope_index(*args, **kwargs)
        return positions.permute(2, 1, 0).contiguous().permute(2, 1, 0), deltas

    def position_ids(self, *args, **kwargs):
        return super().position_ids(*args, **kwargs).permute(0, 2, 1).contiguous().permute(0, 2, 1)


class RaisingKernel(ToyKernel):
    def rope_index(self, *args, **kwargs):
        raise ValueError("no positions today")


KERNELS = {"counting": lambda: ToyKernel(), "raising": lambda: RaisingKernel(), "placing": lambda: ToyKernel(places_packed_rows=True),
           "direct": lambda: DirectKernel(places_packed_rows=True), "misshapen": lambda: MisshapenKernel(True),
           "int32": lambda: Int32Kernel(True), "half": lambda: HalfKernel(), "elsewhere": lambda: ElsewhereKernel(), "strided": lambda: StridedKernel(True),
           "decoding": lambda: DecodingKernel(), "decoding, placing": lambda: DecodingKernel(True)}


def _relaxed(processor, text=None, **kwargs):
    if not text:
        raise ValueError("ToyProcessor needs text")


@hookimpl
def bind_rope_index(processor, options):
    if isinstance(processor, Toy1dProcessor):
        return RopeBinding(kind="1d")
    if isinstance(processor, ToyProcessor):
        return RopeBinding("mrope", KERNELS[options.get("kernel", "counting")](),
                           options.get("implementation", "fast"), "toy counting")
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
