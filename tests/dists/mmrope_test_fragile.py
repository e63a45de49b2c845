"""A plugin with one flaw at a time, chosen by ``MMROPE_TEST_FLAW``, for showing that fuzzing
finds each: a crash of the process, an untyped error, a changed input, a result other than the
model's own, a call that takes too long, one that allocates far beyond its rows, a packed row
placed as one sample, and vLLM-convention positions other than transformers' where they agree.
It binds Qwen2-VL's processor to Qwen2-VL's own batched kernel, which the flaw then spoils."""

import ctypes
import os
import time

import torch

from mmrope_core import ExampleCase, RopeBinding, hookimpl
from mmrope_core.kernel import RopeKernel
from mmrope_core.mrope import MropeFamily, MropeKernel

_slept = []  # the slow and greedy flaws show once


class FragileKernel(RopeKernel):
    samples_independent = True  # Qwen2-VL's batched kernel inside: no probe spends the one-time flaws

    def __init__(self, family, flaws=("crash", "untyped", "mutates", "greedy", "slow", "wrong", "packed")):
        self.inner = MropeKernel(family)
        self.flaws = flaws

    @property
    def places_packed_rows(self):
        return "packed" in self.flaws and os.environ.get("MMROPE_TEST_FLAW") == "packed"

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        flaw = os.environ.get("MMROPE_TEST_FLAW", "")
        flaw = flaw if flaw in self.flaws else ""
        if flaw == "packed" and cu_seqlens is not None:  # the packed row placed as one sample
            positions, deltas = self.inner.rope_index(input_ids, attention_mask, **inputs)
            return positions, deltas.expand(cu_seqlens.numel() - 1, 1)
        if flaw == "crash":
            ctypes.string_at(0)  # reads address 0: the process dies
        if flaw == "untyped":
            raise IndexError("index 7 is out of bounds")
        if flaw == "mutates":
            input_ids[0, 0] = input_ids[0, 0] + 1  # writes into the caller's tensor
        if flaw == "greedy" and not _slept:
            _slept.append(torch.ones(2**27, dtype=torch.int64))  # 1 GiB for a row of a few dozen tokens
        if flaw == "slow" and not _slept:
            _slept.append(True)
            time.sleep(6)
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        positions, deltas = self.inner.rope_index(input_ids, attention_mask, **packed, **inputs)
        if flaw in ("wrong", "vllm"):
            positions = positions + 1
        return positions, deltas


@hookimpl
def bind_rope_index(processor, config, options):
    if type(processor).__name__ != "Qwen2VLProcessor":
        return None
    family = MropeFamily("Qwen2-VL", spatial_merge_size=2, image_token_id=processor.image_token_id,
                         video_token_id=processor.video_token_id, image_key="image_grid_thw",
                         video_key="video_grid_thw")
    if options.get("implementation") == "reference":  # the flawless kernel, for the fuzzer to compare with
        return RopeBinding(kind="mrope", kernel=MropeKernel(family), implementation="reference")
    if options.get("convention", "transformers") == "vllm":  # the same positions: there is no video here
        return RopeBinding(kind="mrope", kernel=FragileKernel(family, flaws=("vllm",)), implementation="fast")
    return RopeBinding(kind="mrope", kernel=FragileKernel(family), implementation="fast")


@hookimpl
def example_cases():
    from mmrope_qwen_vl.examples import build, image_samples

    return [ExampleCase("Qwen2-VL", lambda: build("Qwen2-VL"), image_samples)]


@hookimpl
def varlen_keys(processor):
    return {"mm_token_type_ids"} if type(processor).__name__ == "Qwen2VLProcessor" else None


@hookimpl
def get_rope_index_kwargs(processor, multi_modal_inputs, mm_processor_kwargs):
    if type(processor).__name__ != "Qwen2VLProcessor":
        return None
    return {key: multi_modal_inputs[key] for key in ("image_grid_thw", "video_grid_thw") if key in multi_modal_inputs}
