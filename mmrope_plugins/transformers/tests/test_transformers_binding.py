"""mmrope-transformers: what it binds, decided from the installed transformers, and how."""

import functools
import pathlib
import random
import re
import types
import warnings

import pytest
import torch
import transformers

from mmrope_core import InvalidInputError, PluginManager, RopeEngine, UnsupportedProcessorError
from mmrope_core.testing import assert_conforms
from mmrope_core.tiny import random_image
from mmrope_transformers import examples
from mmrope_transformers.models import decide

MODELS_DIR = pathlib.Path(transformers.__file__).parent / "models"

#: (model type, implementation) on this transformers: the layouts the batched kernel knows, and
#: the model types with rules of their own
FAST = ["qwen4_exp", "cosmos3_omni", "cosmos3_edge", "cohere_compass", "glm_ocr", "glmga", "paddleocr_vl",
        "ernie4_5_vl_moe", "hy_v4_vl"]
REFERENCE = ["hunyuan_vl", "minicpmv4_7", "glm_image"]
ONE_D = ["llava", "llava_next", "llava_onevision", "gemma3", "internvl", "idefics3", "mllama", "aria", "exaone4_5"]
#: processors that cannot be built offline (torchvision image processors, the num2words package) and
#: other vision-language models without M-RoPE: their configs alone decide (Pixtral checkpoints
#: carry a llava or mistral3 config; "pixtral" is the model type of their vision encoder)
ONE_D_CONFIG_ONLY = ["mistral3", "llama4", "phi4_multimodal", "smolvlm", "paligemma", "video_llama_3",
                     "lfm3_vl", "gemma4"]


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "transformers"})


def present(model_types):
    return [model_type for model_type in model_types if model_type in transformers.CONFIG_MAPPING]


@functools.cache
def built(model_type):
    return examples.build(examples.spec_of(model_type))


def bind(manager, model_type, **options):
    processor, config = built(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return RopeEngine.from_processor(processor, config, plugin_manager=manager, **options)


def rope_model_types_by_source():
    """Model types whose modeling file defines get_rope_index, found by reading the files (not by
    the plugin's lookup), with the module they are in."""
    found = {}
    for path in sorted(MODELS_DIR.glob("*/modeling_*.py")):
        if re.search(r"^\s+def get_rope_index\(", path.read_text(encoding="utf-8"), re.MULTILINE):
            found[path.parent.name] = path
    return found


# -- recognition ---------------------------------------------------------------------------------

def test_every_model_type_whose_model_defines_get_rope_index_is_mrope():
    """All model types of this transformers, from its own files: the model type of each modeling
    module that defines get_rope_index is M-RoPE, but for EXAONE 4.5 on 5.10, whose forward never
    calls it."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_types = [model_type for model_type in rope_model_types_by_source() if model_type in CONFIG_MAPPING_NAMES]
    assert len(model_types) >= 15
    for model_type in model_types:
        decision = decide(transformers.AutoConfig.for_model(model_type))
        if model_type == "exaone4_5":
            assert decision.kind == "1d" and "never calls" in decision.reason, decision
            continue
        assert decision.kind == "mrope", (model_type, decision)
        assert "get_rope_index" in vars(decision.model_class) or any(
            "get_rope_index" in vars(base) for base in decision.model_class.__mro__), model_type


def test_glmga_is_found_in_another_models_module_and_omni_through_its_thinker():
    assert decide(transformers.AutoConfig.for_model("glmga")).model_class.__name__ == "Glm46VModel"
    omni = decide(transformers.AutoConfig.for_model("qwen3_omni_moe"))
    assert omni.kind == "mrope" and omni.config.model_type == "qwen3_omni_moe_thinker"
    assert "Thinker" in omni.model_class.__name__


@pytest.mark.parametrize("model_type", present(ONE_D + ONE_D_CONFIG_ONLY))
def test_vision_language_models_without_mrope_are_one_d_by_their_config(model_type):
    decision = decide(transformers.AutoConfig.for_model(model_type))
    assert decision.kind == "1d", decision
    assert "no M-RoPE sections" in decision.reason


def test_a_config_declaring_mrope_without_a_method_is_not_guessed():
    config = transformers.AutoConfig.for_model("llava")
    config.text_config.rope_parameters = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [16, 24, 24]}
    assert decide(config).kind is None


def test_a_model_type_transformers_does_not_know_is_not_guessed():
    config = transformers.PretrainedConfig()
    config.model_type = "never_released_vl"
    assert decide(config).kind is None


# -- bindings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", present(FAST))
def test_families_sharing_a_known_layout_get_the_batched_kernel(manager, model_type):
    engine = bind(manager, model_type)
    assert (engine.plugin_name, engine.rope_kind, engine.implementation) == ("transformers", "mrope", "fast")
    assert "equal to" in engine.binding.description and model_type in repr(engine)


@pytest.mark.parametrize("model_type", present(REFERENCE))
def test_families_with_rules_of_their_own_get_their_reference_with_one_warning(manager, model_type, monkeypatch):
    from mmrope_core import reference as probing

    monkeypatch.setattr(probing, "_probed", {})
    processor, config = built(model_type)
    with pytest.warns(RuntimeWarning, match="mmrope-transformers: .*get_rope_index .*reference computes the positions"):
        engine = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        again = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    assert engine.implementation == again.implementation == "reference"
    assert "transformers reference" in repr(engine)


@pytest.mark.parametrize("model_type", present(ONE_D))
def test_processors_without_mrope_get_one_d_positions(manager, model_type):
    engine = bind(manager, model_type)
    assert (engine.plugin_name, engine.rope_kind, engine.implementation) == ("transformers", "1d", "mask")
    processor, _ = built(model_type)
    outputs = [engine.process(**sample) for sample in examples.samples(examples.spec_of(model_type), processor,
                                                                     random.Random(0))]
    ids, mask, inputs = engine.batch(outputs, padding_side="left")
    positions = engine.compute_position_ids(ids, mask, inputs)
    assert torch.equal(positions, (mask.cumsum(-1) - 1).clamp(min=0))


def test_varlen_keys_are_the_outputs_the_processor_declares(manager):
    assert {"pixel_values", "pixel_attention_mask"} <= bind(manager, "idefics3").varlen_keys
    assert {"token_type_ids", "pixel_values"} <= bind(manager, "gemma3").varlen_keys
    assert {"cross_attention_mask", "aspect_ratio_ids", "aspect_ratio_mask"} <= bind(manager, "mllama").varlen_keys
    assert "input_ids" not in bind(manager, "llava").varlen_keys
    if "ernie4_5_vl_moe" in transformers.CONFIG_MAPPING:
        assert {"mm_token_type_ids", "moe_mm_token_type_ids"} <= bind(manager, "ernie4_5_vl_moe").varlen_keys


def test_one_d_processors_keep_their_own_validation(manager):
    engine = bind(manager, "gemma3")
    assert engine.validation_policy.strict
    image = random_image(random.Random(0), 56, 56)
    with pytest.raises(ValueError, match="image"):  # two placeholders, one image: the processor's own check
        engine.process(text=["the <start_of_image> cat <start_of_image>"], images=[[image]], return_tensors="pt")


def test_the_implementation_option(manager):
    model_type = present(FAST)[0]
    assert bind(manager, model_type, implementation="reference").implementation == "reference"
    with pytest.raises(InvalidInputError, match=r"implementation='turbo'.*'fast', 'reference'"):
        bind(manager, model_type, implementation="turbo")


@pytest.mark.parametrize("model_type", present(ONE_D + ONE_D_CONFIG_ONLY))
def test_the_vision_language_configs_take_images(model_type):
    from mmrope_transformers.models import sees_images

    assert sees_images(transformers.AutoConfig.for_model(model_type))


def test_a_text_only_config_for_a_processor_of_images_is_refused(manager):
    """Not 1-D by mistake: a Qwen-VL or LLaVA processor with a language model's config."""
    for model_type in ("llava", "qwen4_exp" if "qwen4_exp" in transformers.CONFIG_MAPPING else "glm_ocr"):
        processor, _ = built(model_type)
        with pytest.raises(InvalidInputError, match=r"places media tokens.*model_type 'llama'.*own config"):
            RopeEngine.from_processor(processor, transformers.AutoConfig.for_model("llama"), plugin_manager=manager)


def test_without_a_config_the_plugin_declines(manager):
    processor, _ = built("llava")
    with pytest.raises(UnsupportedProcessorError, match="LlavaProcessor"):
        RopeEngine.from_processor(processor, None, plugin_manager=manager)


def test_a_processor_computing_positions_itself_is_declined(manager):
    processor, config = built("llava")
    computing = types.SimpleNamespace(tokenizer=processor.tokenizer,
                                      model_input_names=["input_ids", "attention_mask", "position_ids"])
    with pytest.raises(UnsupportedProcessorError):
        RopeEngine.from_processor(computing, config, plugin_manager=manager)


@pytest.mark.mmrope_applies("hunyuan_vl" in transformers.CONFIG_MAPPING, "HunYuan-VL")
def test_a_config_the_method_cannot_run_on_is_refused_at_bind_time(manager):
    processor, _ = built("hunyuan_vl")
    with pytest.raises(InvalidInputError, match=r"HunYuanVLModel.get_rope_index fails on the config given.*checkpoint"):
        RopeEngine.from_processor(processor, transformers.AutoConfig.for_model("hunyuan_vl"), plugin_manager=manager)


@pytest.mark.mmrope_applies("qwen4_exp" in transformers.CONFIG_MAPPING, "Qwen4-exp")
def test_family_plugins_answer_first():
    """Qwen3VLProcessor is the Qwen3-VL family's; with a Qwen4-exp config the family plugin
    declines and this one binds."""
    both = PluginManager(env={"MMROPE_LOAD_PLUGINS": "transformers,qwen_vl"})
    processor, config = built("qwen4_exp")
    assert RopeEngine.from_processor(processor, config, plugin_manager=both).plugin_name == "transformers"
    qwen3 = transformers.AutoConfig.for_model("qwen3_vl")
    assert RopeEngine.from_processor(processor, qwen3, plugin_manager=both).plugin_name == "qwen_vl"


def test_the_plugin_conforms():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert_conforms("transformers")


def test_every_example_model_type_is_documented():
    table = (pathlib.Path(__file__).parents[3] / "docs" / "families" / "transformers.md").read_text(encoding="utf-8")
    for spec in (*examples.MROPE_SPECS, *examples.ONE_D_SPECS):
        assert f"| `{spec.model_type}` |" in table, spec.model_type


def test_mmrope_plugins_models_lists_each_example_and_what_it_got(monkeypatch, capsys):
    import json

    from mmrope_core import cli
    from mmrope_core import manager as managers

    monkeypatch.setattr(managers, "_default_manager", PluginManager(env={"MMROPE_LOAD_PLUGINS": "transformers"}))
    assert cli.main(["plugins", "--models", "--json"]) == 0
    rows = {row["model_type"]: row for row in json.loads(capsys.readouterr().out)}
    for model_type in present(FAST):
        assert (rows[model_type]["plugin"], rows[model_type]["implementation"]) == ("transformers", "fast")
    for model_type in present(REFERENCE):
        assert rows[model_type]["implementation"] == "reference"
    for model_type in present(ONE_D):
        assert (rows[model_type]["kind"], rows[model_type]["implementation"]) == ("1d", "mask")


@pytest.mark.parametrize("model_type, independent", [("minicpmv4_7", True), ("glm_image", True),
                                                     ("hunyuan_vl", False)])
def test_a_reference_is_taken_as_independent_of_other_samples_only_where_shown(manager, model_type, independent):
    """The core's probe, on a sample drawn for the model type: MiniCPM-V's and GLM-Image's show it
    (MiniCPM-V's grids are its crops' target sizes); HunYuan-VL's shows it numbers images across a batch."""
    if model_type not in present(REFERENCE):
        pytest.skip(f"this transformers has no {model_type}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reference's one warning
        engine = bind(manager, model_type)
    assert engine.binding.kernel.samples_independent is None  # not declared: shown by the core
    assert engine.samples_independent is independent


def test_a_model_type_without_a_sample_to_probe_is_not_taken_as_independent(manager, monkeypatch):
    """What is not shown is not assumed: with no example case that draws a sample with media for
    it, a packed row's segments are taken to depend on those before them."""
    if "minicpmv4_7" not in present(REFERENCE):
        pytest.skip("this transformers has no minicpmv4_7")
    assert bind(manager, "minicpmv4_7").samples_independent
    monkeypatch.setattr(manager, "results_of", lambda name, hook, **kwargs: [] if hook == "example_cases" else
                        type(manager).results_of(manager, name, hook, **kwargs))
    assert not bind(manager, "minicpmv4_7").samples_independent


@pytest.mark.parametrize("where", ["text_config", "decoder"])
def test_a_config_with_several_text_configs_has_each_checked_for_its_padding_side(where):
    """transformers' get_text_config raises ValueError where a config holds several text configs;
    each is then read, and a NoPE temperature in any refuses left padding."""
    from mmrope_transformers import batching

    config = transformers.PretrainedConfig()
    config.text_config, config.decoder = transformers.LlamaConfig(), transformers.LlamaConfig()
    with pytest.raises(ValueError, match="Multiple valid text configs"):
        config.get_text_config()
    assert batching._refused_sides(config) == {}
    setattr(config, where, transformers.Llama4TextConfig(num_hidden_layers=4))
    assert "NoPE layers" in batching._refused_sides(config)["left"]
