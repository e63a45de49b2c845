"""ms-swift 4.6.0's own templates and data collator, with and without mmrope's drop-in, against the
model classes' own ``get_rope_index``: padded batches and ``padding_free`` rows (what its
``packing`` builds too) of every family whose template computes M-RoPE positions."""

from __future__ import annotations

import copy
import importlib
import random
import subprocess
import sys
import warnings

import pytest
import swift_cases as cases
import torch

from mmrope_core import GeneratedMaskWarning, UnknownConventionError
from mmrope_core.integrations import swift as drop_in

FAMILIES = list(cases.FAMILIES)
RIGHT_ALONE = [name for name in FAMILIES if name not in (*cases.GLM, "Qwen3-Omni")]


def _position_classes():
    for module_name, names in drop_in.TEMPLATE_CLASSES.items():
        module = importlib.import_module(module_name)
        yield from (getattr(module, name) for name in names)


def _uninstall():
    for cls in _position_classes():
        method = cls.__dict__["_get_position_ids"]
        cls._get_position_ids = getattr(method, "__mmrope_original__", method)


@pytest.fixture
def installed():
    drop_in.install()
    yield
    _uninstall()
    drop_in._settings.update(mm_processor_kwargs={}, convention=None)


def padded(name, seed, count=4, **kwargs):
    template = cases.template(name)
    template.use_audio_in_video = kwargs.get("use_audio_in_video", False)  # ms-swift's USE_AUDIO_IN_VIDEO
    samples = cases.rows(name, template, random.Random(seed), count, **kwargs)
    batch = template.data_collator([row for row, _ in samples])
    reference = cases.reference_positions(name, batch["input_ids"], batch["attention_mask"],
                                          cases.stacked_kwargs([kwargs for _, kwargs in samples]))
    return batch, reference


def packed(name, seed, count=4, *, model=True, **kwargs):
    """One ``padding_free`` row and, per sample, its reference positions alone."""
    template = cases.template(name, padding_free=True, model=model)
    template.use_audio_in_video = kwargs.get("use_audio_in_video", False)
    samples = cases.rows(name, template, random.Random(seed), count, **kwargs)
    batch = template.data_collator([row for row, _ in samples])
    references = []
    for row, reference_kwargs in samples:
        ids = torch.tensor([row["input_ids"]])
        references.append(cases.reference_positions(name, ids, torch.ones_like(ids), reference_kwargs))
    return batch, references


def assert_packed(batch, references):
    """Each sample's ``(t, h, w)`` equal to its reference alone, dtype included; ms-swift's own
    text row restarts at 0 in each (its flash-attention boundaries come from it)."""
    start = 0
    for reference in references:
        length = reference.shape[-1]
        got = batch["position_ids"][:, :, start:start + length]
        assert got.dtype == reference.dtype
        assert torch.equal(got, reference)
        assert torch.equal(batch["text_position_ids"][0, start:start + length].long(), torch.arange(length))
        start += length
    assert start == batch["position_ids"].shape[-1]
    starts = torch.tensor([0, *torch.cumsum(torch.tensor([r.shape[-1] for r in references]), 0).tolist()])
    assert torch.equal(batch["cu_seq_lens_q"].long(), starts)


@pytest.mark.parametrize("name", FAMILIES)
def test_padded_batches_equal_the_reference(name, installed):
    for seed in range(3):
        batch, reference = padded(name, seed)
        assert batch["position_ids"].dtype == reference.dtype
        assert torch.equal(batch["position_ids"], reference)
        assert torch.equal(batch["text_position_ids"], torch.arange(reference.shape[-1]).expand(reference.shape[1], -1))


@pytest.mark.parametrize("name", FAMILIES)
def test_padding_free_rows_equal_the_reference_per_sample(name, installed):
    for seed in range(3):
        assert_packed(*packed(name, seed))


@pytest.mark.parametrize("name", ["Qwen2.5-VL", "GLM-4.5V", "Qwen3-Omni"])
def test_packing_groups_equal_the_reference_per_sample(name, installed):
    """``--packing``: ms-swift's packed dataset hands the collator groups of rows, which it joins
    into one ``padding_free`` row."""
    template = cases.template(name, padding_free=True)
    template.packing = True
    samples = cases.rows(name, template, random.Random(4), 5)
    rows = [row for row, _ in samples]
    batch = template.data_collator([rows[:2], rows[2:]])
    references = [cases.reference_positions(name, torch.tensor([row["input_ids"]]),
                                            torch.ones(1, len(row["input_ids"]), dtype=torch.long), kwargs)
                  for row, kwargs in samples]
    assert_packed(batch, references)


@pytest.mark.parametrize("name", RIGHT_ALONE)
def test_swift_alone_is_right_on_these(name):
    """The positive control: where ms-swift's own positions are right, the harness says so."""
    batch, reference = padded(name, seed=0)
    assert torch.equal(batch["position_ids"], reference)
    assert_packed(*packed(name, seed=0))


@pytest.mark.parametrize("name", cases.GLM)
def test_glm_videos_crash_swift_alone(name):
    """GLM-4.1V and GLM-4.5V: ms-swift types video frames (image tokens between video markers)
    as images; a batch with a video raises in the model's ``get_rope_index``."""
    with pytest.raises(RuntimeError, match="shape mismatch: value tensor of shape") as caught:
        padded(name, seed=0)
    assert caught.traceback[-1].name == "get_rope_index"
    with pytest.raises(StopIteration) as caught:
        packed(name, seed=0)
    assert caught.traceback[-1].name == "get_rope_index"


def test_glm_4_1v_encode_refuses_videos():
    """Why GLM-4.1V's video rows here are built, not encoded: its template refuses videos."""
    template = cases.template("GLM-4V")
    with pytest.raises(AssertionError) as caught:
        template.encode({"messages": [{"role": "user", "content": "<video> the"}, {"role": "assistant", "content": "cat"}],
                         "videos": ["clip.mp4"]})
    assert caught.traceback[-1].name == "replace_tag" and "swift/template/templates/glm.py" in str(caught.traceback[-1].path)


def test_qwen3_omni_positions_truncated_by_swift_alone():
    name = "Qwen3-Omni"
    batch, reference = padded(name, seed=0, count=8, use_audio_in_video=True)
    assert batch["position_ids"].dtype == torch.int64 and reference.is_floating_point()
    assert torch.equal(batch["position_ids"], reference.trunc().long())
    assert not torch.equal(batch["position_ids"].float(), reference)


def test_qwen3_omni_positions_float_with_the_drop_in(installed):
    name = "Qwen3-Omni"
    batch, reference = padded(name, seed=0, count=8, use_audio_in_video=True)
    assert not torch.equal(reference, reference.trunc())  # fractional positions are there
    assert batch["position_ids"].dtype == torch.float32 and torch.equal(batch["position_ids"], reference)


@pytest.mark.parametrize("name", cases.OMNI)
def test_audio_in_video(name, installed):
    """ms-swift's ``USE_AUDIO_IN_VIDEO`` setting (the template's ``use_audio_in_video``)."""
    batch, reference = padded(name, seed=5, count=3, use_audio_in_video=True)
    assert torch.equal(batch["position_ids"], reference)
    assert_packed(*packed(name, seed=5, count=3, use_audio_in_video=True))


def test_no_model_needed(installed):
    """ms-swift alone builds a model on the meta device from the checkpoint to reach
    ``get_rope_index``; the drop-in needs only the processor and the config."""
    assert_packed(*packed("Qwen2.5-VL", seed=2, model=False))
    _uninstall()
    with pytest.raises(ValueError, match="path: '/tiny/qwen2_5_vl' not found"):  # ms-swift's own: no checkpoint
        packed("Qwen2.5-VL", seed=2, model=False)


def test_external_plugins_file_installs_it():
    """The path ``python -m mmrope_core.integrations.swift`` prints, loaded the way ms-swift's
    ``--external_plugins`` loads files."""
    from swift.utils import import_external_file

    path = subprocess.run([sys.executable, "-m", "mmrope_core.integrations.swift"], check=True, capture_output=True,
                          text=True).stdout.strip()
    try:
        import_external_file(path)
        assert drop_in.installed()
        batch, reference = padded("GLM-4V", seed=0)
        assert torch.equal(batch["position_ids"], reference)
    finally:
        _uninstall()


def test_external_plugins_file_takes_the_convention_from_the_environment(monkeypatch):
    """``MMROPE_CONVENTION=vllm swift rlhf ... --external_plugins ...``: GRPO with vLLM rollouts
    trains on vLLM's positions; a convention nobody knows stops ms-swift as it loads the file."""
    from swift.utils import import_external_file

    path = subprocess.run([sys.executable, "-m", "mmrope_core.integrations.swift"], check=True, capture_output=True,
                          text=True).stdout.strip()
    def load(convention):  # as a fresh ms-swift process does (ms-swift loads a file once per process)
        monkeypatch.setenv("MMROPE_CONVENTION", convention)
        sys.modules.pop(import_external_file(path).__name__, None)
        import_external_file(path)

    try:
        load("vllm")
        assert drop_in.template_engine(cases.template("Qwen2.5-VL")).convention == "vllm-0.34"
        with pytest.raises(UnknownConventionError, match=r"'vlm' \(the environment's MMROPE_CONVENTION\) is unknown; "
                                                         r"the known ones are 'transformers', 'vllm-0.33'"):
            load("vlm")
        assert drop_in._settings["convention"] == "vllm"  # nothing installed from the refused name
        load("")
        assert drop_in.template_engine(cases.template("Qwen2.5-VL")).convention == "transformers"
    finally:
        _uninstall()
        drop_in._settings.update(mm_processor_kwargs={}, convention=None)


def test_a_convention_nobody_knows_is_refused_at_install(installed):
    with pytest.raises(UnknownConventionError, match=r"'vlm' \(mmrope_core.integrations.swift.install\(convention=...\)\) "
                                                     r"is unknown; the known ones are 'transformers', 'vllm-0.33'.*"
                                                     r"vllm means 'vllm-0.34'"):
        drop_in.install(convention="vlm")
    assert drop_in._settings["convention"] is None


def test_install_is_idempotent(installed):
    before = [cls.__dict__["_get_position_ids"] for cls in _position_classes()]
    drop_in.install()
    assert [cls.__dict__["_get_position_ids"] for cls in _position_classes()] == before


# -- what ms-swift does with packed rows itself -----------------------------------------------------


def test_ms_swift_packs_only_with_flash_attention():
    """ms-swift refuses ``padding_free`` and ``packing`` unless flash-attention runs: the model
    then takes the boundaries from ms-swift's own ``cu_seq_lens_q/k``, where attention keeps the
    samples apart; the drop-in changes the positions only."""
    from swift.arguments.sft_args import SftArguments

    for feature in ("padding_free", "packing"):
        settings = {"padding_free": feature == "padding_free", "packing": feature == "packing", "attn_impl": "sdpa"}
        with pytest.raises(ValueError, match=f'The "{feature}" feature requires a flash attention implementation'):
            SftArguments._check_padding_free(type("Arguments", (), settings)())


def test_ms_swift_refuses_qwen3_5_packing_without_flash_linear_attention():
    """ms-swift runs Qwen3.5's linear attention on packed rows with its own kernels, which read
    its ``cu_seq_lens_q``; without flash-linear-attention it refuses several samples in one row."""
    from swift.model.models.qwen import _get_linear_attention_kernels
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    config = Qwen3_5TextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                               linear_value_head_dim=8)
    layer = Qwen3_5GatedDeltaNet(config, layer_idx=0)
    _get_linear_attention_kernels(layer, torch.tensor([0, 9], dtype=torch.int32))  # one sample: the PyTorch fallback
    with pytest.raises(ImportError, match="requires flash-linear-attention"):
        _get_linear_attention_kernels(layer, torch.tensor([0, 5, 9], dtype=torch.int32))


@pytest.mark.parametrize("convention", ["vllm", "sglang"])
def test_the_templates_take_the_convention_install_names(convention, installed):
    """GRPO with a rollout engine's positions: Qwen2.5-VL's text after a video."""
    from mmrope_core import RopeEngine

    drop_in.install(convention=convention)
    processor, config = cases.family("Qwen2.5-VL")
    engine = RopeEngine.from_processor(processor, config, convention=convention)
    differ = 0
    for seed in range(4):
        batch, reference = padded("Qwen2.5-VL", seed)
        mask = batch["attention_mask"]
        kwargs = {key: batch[key] for key in ("image_grid_thw", "video_grid_thw") if batch.get(key) is not None}
        if batch.get("second_per_grid_ts") is not None:
            kwargs["second_per_grid_ts"] = torch.tensor(batch["second_per_grid_ts"], dtype=torch.float32)
        want, _ = engine.get_rope_index(batch["input_ids"], mask, **kwargs)
        assert torch.equal(batch["position_ids"], want)
        differ += not torch.equal(batch["position_ids"], reference)
    assert differ > 0


def test_a_template_whose_family_lacks_the_convention_is_refused_when_its_processor_is_set(installed):
    from mmrope_core import GeneratedMaskWarning, UnknownConventionError

    drop_in.install(convention="sglang")
    with pytest.raises(UnknownConventionError, match=r"SGLang 0\.5\.23 has no Qwen2\.5-Omni model"):
        cases.template("Qwen2.5-Omni")
    with pytest.warns(GeneratedMaskWarning):  # see below
        assert cases.template("Qwen3-Omni").processor is not None


def test_sglangs_qwen3_omni_positions_say_that_ms_swift_carries_no_generated_mask(installed):
    """ms-swift's rows carry no ``generated_mask``: where SGLang decodes replies apart from a
    prefill (Qwen3-Omni), the engine says what the positions are instead, once per engine."""
    drop_in.install(convention="sglang")
    with pytest.warns(GeneratedMaskWarning, match=r"ms-swift's templates carry no generated_mask: every token is "
                                                  r"placed as a prefill"):
        template = cases.template("Qwen3-Omni")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GeneratedMaskWarning)
        padded_rows = template.data_collator([row for row, _ in cases.rows("Qwen3-Omni", template, random.Random(2), 2)])
        assert padded_rows["position_ids"].dtype == torch.int64  # SGLang's positions, as a prefill places them
        cases.template("Qwen2.5-VL")  # SGLang decodes its replies where a prefill puts them
        drop_in.install(convention="vllm")
        cases.template("Qwen3-Omni")


# -- what the engine says of the model (batch_layout, samples_independent) ---------------------------


def test_a_padding_side_the_model_gets_wrong_is_refused(installed, monkeypatch):
    from layout_plugins import ThirdParty, default_manager_with

    from mmrope_core.batching import BatchLayout
    from mmrope_core.errors import PaddingUnsupportedError

    default_manager_with(monkeypatch, ThirdParty(layout=BatchLayout(refused_sides={"left": "its layers read slots"})))
    template = cases.template("Qwen2-VL")
    rows = [row for row, _ in cases.rows("Qwen2-VL", template, random.Random(1), 3)]
    template.padding_side = "left"
    with pytest.raises(PaddingUnsupportedError, match="padded on the left: its layers read slots; set ms-swift's "
                                                      "padding_side to 'right'"):
        template.data_collator(copy.deepcopy(rows))
    template.padding_side = "right"
    assert template.data_collator(copy.deepcopy(rows))["position_ids"].shape[0] == 3  # the text row dropped by ms-swift


def test_a_reference_numbering_images_across_the_batch_is_computed_sample_by_sample(installed, monkeypatch):
    """A third party's reference that numbers images across the batch (as HunYuan-VL's does): a
    padded batch, whose positions ms-swift computes in one call, is refused; a ``padding_free``
    row, computed sample by sample, gives each its positions alone."""
    from layout_plugins import ThirdParty, default_manager_with

    from mmrope_core.errors import CollateError

    default_manager_with(monkeypatch, ThirdParty(numbering=True))
    template = cases.template("Qwen2-VL")
    rows = [row for row, _ in cases.rows("Qwen2-VL", template, random.Random(2), 3)]
    with pytest.raises(CollateError, match="ms-swift computes a padded batch's positions in one call"):
        template.data_collator(rows)
    assert_packed(*packed("Qwen2-VL", seed=2, count=4))
