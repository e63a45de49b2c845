"""Corrupt batches of every installed family, drawn by hypothesis and fed in a child process
(``mmrope_core.testing.fuzz``) to the engines (both implementations and, where the family offers
it, ``convention="vllm"``), to packed rows (``cu_seqlens`` and ``segment_ids``, valid and corrupt)
and to the collators: nothing crashes, stalls, allocates beyond its rows or changes its inputs;
every result is what the model computes itself (transformers' own ``get_rope_index``, called
directly), each packed segment its sample's alone; everything else is a typed input error."""

import pytest

from mmrope_core.testing.fuzz import fuzz_plugin

# corrupt batches per plugin: three minutes in all on two cores
EXAMPLES = {"qwen_vl": 1200, "qwen3_omni": 800, "gemma4": 200, "transformers": 600, "storyboard": 200}

#: families whose vLLM positions are transformers' on every input (docs/parity.md); the others are
#: held to transformers' on batches without video or audio
VLLM_AS_TRANSFORMERS = ("Qwen3-VL", "Qwen3-VL-MoE", "Qwen3.5", "Qwen3.5-MoE", "GLM-4V", "GLM-4V-MoE", "GLM-4.6V",
                        *(f"{name} ({model_type})" for name, model_type in (
                            ("Qwen4-exp", "qwen4_exp"), ("Cosmos3-Omni", "cosmos3_omni"),
                            ("Cosmos3-Edge", "cosmos3_edge"), ("Cohere-Compass", "cohere_compass"),
                            ("GLM-OCR", "glm_ocr"), ("GLM-GA", "glmga"), ("PaddleOCR-VL", "paddleocr_vl"),
                            ("HY-V4-VL", "hy_v4_vl"))))

#: what the fuzzer finds that is not mended yet, (plugin, example case, rule), each with its cause
KNOWN = {
    # GLM-Image's images_per_sample holds one count per sample: two samples merged into one segment
    # keep both counts, one more than the row has segments; its get_rope_index, which splits the
    # grids by those counts, fails on the packed row, while the merged sample alone computes
    ("transformers", "GLM-Image (glm_image)", "a packed row is refused exactly where a sample alone is"),
}


@pytest.mark.parametrize("plugin", sorted(EXAMPLES))
def test_no_corrupt_batch_crashes_stalls_or_is_silently_wrong(plugin):
    unjudged: dict[str, int] = {}
    findings = fuzz_plugin(plugin, seed=20261202, examples=EXAMPLES[plugin], chooser="hypothesis",
                           vllm_as_transformers=VLLM_AS_TRANSFORMERS, unjudged=unjudged)
    print(f"{plugin}: {sum(unjudged.values())} cases unchecked, the model's own code failing: {unjudged}")
    unknown = [finding for finding in findings if (plugin, finding.case, finding.rule) not in KNOWN]
    assert unknown == [], "\n".join(map(str, unknown))


@pytest.mark.parametrize("flaw, rule", [
    ("crash", "no input ends the process"),
    ("untyped", "bad input raises a typed input error"),
    ("mutates", "inputs are not changed"),
    ("wrong", "results are the model's own"),
    ("slow", "a case costs what its rows cost"),
    ("greedy", "a case costs what its rows cost"),
    ("packed", "packed segments are their samples alone"),
    ("vllm", "the vLLM convention is transformers' where they agree"),
])
def test_the_fuzzer_finds_each_kind_of_flaw(test_dists, monkeypatch, flaw, rule):
    monkeypatch.setenv("MMROPE_TEST_FLAW", flaw)
    findings = fuzz_plugin("fragile", seed=1, examples=12)
    assert rule in {finding.rule for finding in findings}, findings


def test_a_flawless_plugin_gives_no_finding(test_dists, monkeypatch):
    monkeypatch.delenv("MMROPE_TEST_FLAW", raising=False)
    assert fuzz_plugin("fragile", seed=1, examples=40) == []


def test_a_failing_reference_is_counted_and_on_an_example_sample_found(tmp_path):
    """Where the model's own code fails there is nothing to compare: such cases are counted, and
    on an example's own samples (no mutation) they are a finding, since that check never runs."""
    from mmrope_core.testing._fuzzer import _Fuzzer
    from mmrope_core.testing._mutations import Case

    fuzzer = _Fuzzer("fragile", str(tmp_path / "trace"))
    case = Case("Example", "PackedCollator", None, None, {}, {}, [])
    fuzzer.failed(case, ("a mutation",), "a collated sample")(ValueError("cannot"))
    assert fuzzer.unjudged == {"Example: a collated sample (ValueError)": 1} and fuzzer.findings == []
    fuzzer.failed(case, (), "a collated sample")(ValueError("cannot"))
    assert fuzzer.unjudged == {"Example: a collated sample (ValueError)": 2}
    assert [finding.rule for finding in fuzzer.findings] == ["the model computes each example sample alone"]
