"""Probing a fast implementation against the installed reference, once per process."""

import threading
import time
import warnings

import pytest
import torch

from mmrope_core import reference


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(reference, "_probed", {})


def test_a_probe_runs_once_per_key_and_only_a_failed_one_warns(fresh):
    calls = []

    def probe(answer):
        return lambda: calls.append(answer) or answer

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reference.probe_once(("p", 1), probe("scaled"), fast="p: the fast kernel") == "scaled"
        assert reference.probe_once(("p", 1), probe("other"), fast="p: the fast kernel") == "scaled"  # cached
    with pytest.warns(RuntimeWarning, match=r"^p: the fast kernel does not reproduce transformers .*reference "
                                            r"implementation is used"):
        assert reference.probe_once(("p", 2), probe(None), fast="p: the fast kernel") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reference.probe_once(("p", 2), probe("scaled"), fast="p: the fast kernel") is None  # no second warning
    assert calls == ["scaled", None]


def test_engines_built_on_several_threads_probe_once(fresh):
    calls, started = [], threading.Barrier(8)

    def probe():
        calls.append(1)
        time.sleep(0.05)  # long enough for the other threads to ask meanwhile
        return "scaled"

    def build():
        started.wait()
        assert reference.probe_once("shared", probe, fast="p") == "scaled"

    threads = [threading.Thread(target=build) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [1]


def test_a_batched_kernel_that_disagrees_gives_way_to_the_reference_with_one_warning(fresh):
    """A future transformers whose Qwen2.5-VL text resumes one later: no temporal rule of the
    batched kernel reproduces it, so fast_kernel says so once and returns None."""
    import transformers
    from transformers.models.qwen2_5_vl import Qwen2_5_VLModel

    from mmrope_core.mrope import MropeFamily, MropeKernel, TemporalRule, fast_kernel

    config = transformers.AutoConfig.for_model("qwen2_5_vl")
    family = MropeFamily("Qwen2.5-VL", spatial_merge_size=2, image_token_id=5, video_token_id=6,
                         temporal=TemporalRule(config.vision_config.tokens_per_second, precision="seconds"),
                         image_key="image_grid_thw", video_key="video_grid_thw", seconds_key="second_per_grid_ts")
    # the forms transformers releases have taken: in the seconds' dtype, and with whole seconds first
    rules = (TemporalRule(precision="seconds"), TemporalRule(precision="seconds", whole_seconds=True))
    reference = reference_module_kernel(Qwen2_5_VLModel, config, family)
    assert fast_kernel(family, reference, rules) is not None  # agrees under the rule of the installed transformers
    original = reference.model.get_rope_index
    reference.model.get_rope_index = lambda **kw: (original(**kw)[0] + 1, original(**kw)[1])
    reference.__class__ = type("Changed", (type(reference),), {"probe_key": ("changed",)})
    with pytest.warns(RuntimeWarning, match=r"the batched Qwen2.5-VL kernel does not reproduce transformers .* the "
                                            r"reference implementation is used"):
        assert fast_kernel(family, reference, rules) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fast_kernel(family, reference, rules) is None  # cached: no second warning
    assert isinstance(MropeKernel(family), MropeKernel)


def reference_module_kernel(model_class, config, family):
    from mmrope_core.mrope import MropeKernel

    return reference.ReferenceKernel(model_class, config, token_types=family.token_types(),
                                     check=MropeKernel(family).check)


def test_a_reference_kernel_takes_what_the_method_names_and_its_token_types():
    import transformers
    from transformers.models.qwen2_vl import Qwen2VLModel

    from mmrope_core.mrope import MropeFamily

    family = MropeFamily("Qwen2-VL", spatial_merge_size=2, image_token_id=5, image_key="image_grid_thw")
    kernel = reference_module_kernel(Qwen2VLModel, transformers.AutoConfig.for_model("qwen2_vl"), family)
    assert "second_per_grid_ts" not in kernel.takes and "mm_token_type_ids" in kernel.takes
    ids = torch.tensor([[1, 5, 5, 5, 5, 2]])
    positions, deltas = kernel.rope_index(ids, None, image_grid_thw=torch.tensor([[1, 4, 4]]), second_per_grid_ts=[1.0],
                                          unknown_key=3)
    assert positions[:, 0].tolist() == [[0, 1, 1, 1, 1, 3], [0, 1, 1, 2, 2, 3], [0, 1, 2, 1, 2, 3]]
    assert deltas.tolist() == [[-2]]
    with pytest.raises(TypeError, match="takes mm_token_type_ids: pass token_types"):
        reference.ReferenceKernel(Qwen2VLModel, transformers.AutoConfig.for_model("qwen2_vl"))
