"""A plugin whose example cases each break another conformance rule (the rules
mmrope_test_nonconforming leaves standing): its hooks answer with the wrong types, and its
kernel's positions change from call to call, with the batch size, or cannot be pickled."""

import itertools

import torch
from mmrope_test_toy import ToyKernel, ToyProcessor, toy_rope_index

from mmrope_core import ExampleCase, RopeBinding, hookimpl


class UnrulyProcessor(ToyProcessor):
    def __init__(self, breaks):
        super().__init__()
        self.breaks = breaks

    def __reduce__(self):
        if self.breaks == "pickling":
            raise TypeError("this processor does not pickle")
        return super().__reduce__()


class UnrulyKernel(ToyKernel):
    def __init__(self, breaks):
        super().__init__()
        self.breaks, self.counter = breaks, itertools.count()

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        positions, deltas = toy_rope_index(input_ids, attention_mask, cu_seqlens)
        if self.breaks == "determinism":
            positions = positions + next(self.counter)
        elif self.breaks == "batch size":
            positions = positions + input_ids.shape[0]
        return positions, deltas


@hookimpl
def bind_rope_index(processor):
    if isinstance(processor, UnrulyProcessor):
        return RopeBinding("mrope", UnrulyKernel(processor.breaks), "fast", f"breaks {processor.breaks}")
    return None


@hookimpl
def get_rope_index_kwargs(processor):
    if isinstance(processor, UnrulyProcessor) and processor.breaks == "kwargs type":
        return ["offset"]
    return None


@hookimpl
def validate_inputs_policy(processor):
    if isinstance(processor, UnrulyProcessor) and processor.breaks == "hook types":
        return "relaxed"
    return None


@hookimpl
def varlen_keys(processor):
    if isinstance(processor, UnrulyProcessor) and processor.breaks == "hook types":
        return "features"
    return None


def _case(breaks, samples=2):
    return ExampleCase(f"Unruly ({breaks})", build=lambda: (UnrulyProcessor(breaks), None),
                       samples=lambda processor, rng: [{"text": ["a b"]}, {"text": ["c d e f"]}][:samples])


@hookimpl
def example_cases():
    return [_case("hook types"), _case("kwargs type"), _case("one sample", samples=1), _case("determinism"), _case("batch size"),
            _case("pickling")]
