"""mmrope-transformers against each model's own get_rope_index, on generated layouts (videos
included) and on the real processors' output, on every supported transformers that has the model."""

import dataclasses
import functools
import inspect
import random
import types
import warnings

import pytest
import torch
import transformers

from mmrope_core import PluginManager, RopeEngine
from mmrope_transformers import examples
from mmrope_transformers.layouts import LAYOUTS, processor_batch, random_batch

#: the class each model's documentation names as holding get_rope_index, looked up without the plugin
MODEL_CLASSES = {
    "qwen4_exp": "Qwen4ExpModel", "cosmos3_omni": "Cosmos3OmniModel", "cosmos3_edge": "Cosmos3EdgeModel",
    "cohere_compass": "CohereCompassModel", "glm_ocr": "GlmOcrModel", "glmga": "Glm46VModel",
    "paddleocr_vl": "PaddleOCRVLModel", "ernie4_5_vl_moe": "Ernie4_5_VLMoeModel", "hy_v4_vl": "HYV4VLModel",
    "hunyuan_vl": "HunYuanVLModel", "minicpmv4_7": "MiniCPMV4_7Model", "glm_image": "GlmImageModel",
    "qwen2_vl": "Qwen2VLModel", "qwen2_5_vl": "Qwen2_5_VLModel", "qwen3_vl": "Qwen3VLModel",
    "qwen3_vl_moe": "Qwen3VLMoeModel", "qwen3_5": "Qwen3_5Model", "qwen3_5_moe": "Qwen3_5MoeModel",
    "glm4v": "Glm4vModel", "glm4v_moe": "Glm4vMoeModel", "glm46v": "Glm46VModel",
}
MODEL_TYPES = [spec.model_type for spec in examples.MROPE_SPECS if examples.available(spec)]
#: batches per model type: many where a batched kernel stands in for the method, a few where the
#: method itself runs and only the plumbing around it is checked
BATCHES = {"fast": 30, "reference": 6}
#: model types whose hand-written layouts are intricate enough to check on the processor's own too
PROCESSOR_CHECKED = ("minicpmv4_7",)
HELPERS = ("get_vision_position_ids", "get_llm_pos_ids_for_vision", "get_chunked_index", "_group_visual_frames",
           "_frame_end_idx", "get_rope_index")

pytestmark = pytest.mark.differential


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "transformers"})


@functools.cache
def built(model_type):
    return examples.build(examples.spec_of(model_type))


@functools.cache
def engine_of(model_type):
    processor, config = built(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return RopeEngine.from_processor(processor, config, plugin_manager=PluginManager(
            env={"MMROPE_LOAD_PLUGINS": "transformers"}))


def own_rope_index(model_type, input_ids, attention_mask, **inputs):
    """The model's get_rope_index on a config-only object, fed as its forward feeds it: token types
    from the processor's own create_mm_token_type_ids, the arguments its signature names."""
    processor, config = built(model_type)
    model_class = getattr(transformers, MODEL_CLASSES[model_type])
    model = types.SimpleNamespace(config=config)
    for name in HELPERS:
        try:
            found = inspect.getattr_static(model_class, name)
        except AttributeError:
            continue
        setattr(model, name, found.__func__ if isinstance(found, staticmethod)
                else types.MethodType(getattr(model_class, name), model))
    if model_type in ("qwen2_5_omni", "qwen3_omni_moe"):
        model.spatial_merge_size = config.vision_config.spatial_merge_size
    parameters = inspect.signature(model_class.get_rope_index).parameters
    arguments = {key: value for key, value in inputs.items() if key in parameters}
    if "mm_token_type_ids" in parameters:
        arguments["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()))
    return model.get_rope_index(input_ids=input_ids, attention_mask=attention_mask, **arguments)


def assert_equal_to_own(model_type, input_ids, attention_mask, inputs):
    engine = engine_of(model_type)
    want, want_deltas = own_rope_index(model_type, input_ids, attention_mask, **inputs)
    kwargs = engine.rope_index_kwargs(inputs)
    got, got_deltas = engine.get_rope_index(input_ids, attention_mask, **kwargs)
    assert got.dtype == want.dtype and torch.equal(got, want), model_type
    assert torch.equal(got_deltas, want_deltas.reshape(-1, 1).to(got_deltas.dtype)), model_type
    four = engine.compute_position_ids(input_ids, attention_mask, inputs)
    assert torch.equal(four[:, 1:], want.transpose(0, 1).to(four.dtype)), model_type


def split(batch):
    return batch["input_ids"], batch["attention_mask"], {k: v for k, v in batch.items()
                                                         if k not in ("input_ids", "attention_mask")}


@pytest.mark.parametrize("model_type", [model_type for model_type in MODEL_TYPES if model_type in LAYOUTS])
def test_generated_layouts_equal_the_models_own(model_type):
    engine = engine_of(model_type)
    processor, config = built(model_type)
    rng = random.Random(f"layouts/{model_type}")
    for _ in range(BATCHES[engine.implementation]):
        assert_equal_to_own(model_type, *split(random_batch(model_type, processor, config, rng)))


@pytest.mark.parametrize("model_type", [model_type for model_type in MODEL_TYPES if model_type in LAYOUTS])
def test_padding_inside_samples_is_skipped_as_the_model_skips_it(model_type):
    """Masked tokens put anywhere in a sample, inside media runs too: the model reads valid
    tokens only, and so does the engine."""
    processor, config = built(model_type)
    rng = random.Random(f"holes/{model_type}")
    for _ in range(5 if engine_of(model_type).implementation == "fast" else 2):
        input_ids, attention_mask, inputs = split(random_batch(model_type, processor, config, rng))
        input_ids, attention_mask = with_holes(input_ids, attention_mask, processor.tokenizer.pad_token_id, rng)
        assert_equal_to_own(model_type, input_ids, attention_mask, inputs)


def with_holes(input_ids, attention_mask, pad, rng, holes=6):
    """Each row with ``holes`` masked pad tokens inserted at random places among its tokens."""
    rows = []
    for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
        pairs = list(zip(ids, mask))
        for _ in range(holes):
            pairs.insert(rng.randint(1, len(pairs) - 1), (pad, 0))
        rows.append(pairs)
    return torch.tensor([[token for token, _ in row] for row in rows]), torch.tensor([[m for _, m in row] for row in rows])


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_processor_made_batches_equal_the_models_own(model_type):
    """The processor's own output, one call per sample, batched as trainers batch it (both sides),
    and, for the most intricate layouts, random images of random sizes."""
    engine = engine_of(model_type)
    processor, _ = built(model_type)
    spec = examples.spec_of(model_type)
    rng = random.Random(f"processor/{model_type}")
    outputs = [engine.process(**sample) for sample in examples.samples(spec, processor, rng)]
    for side in ("right", "left"):
        assert_equal_to_own(model_type, *engine.batch(outputs, padding_side=side))
    if model_type in PROCESSOR_CHECKED:
        for _ in range(BATCHES[engine.implementation]):
            assert_equal_to_own(model_type, *engine.batch(processor_batch(model_type, processor, rng)))


@pytest.mark.parametrize("model_type", [spec.model_type for spec in examples.FAMILY_PLUGIN_SPECS
                                        if examples.available(spec)])
def test_family_plugin_model_types_are_reproduced_by_this_plugin_alone(model_type):
    """What the family plugins bind, this plugin binds too when it is alone: by probing, fast
    (timed videos under the rule of the installed transformers), equal to the model's own."""
    engine = engine_of(model_type)
    assert (engine.plugin_name, engine.implementation) == ("transformers", "fast"), engine
    processor, config = built(model_type)
    rng = random.Random(f"family/{model_type}")
    for _ in range(10):
        assert_equal_to_own(model_type, *split(random_batch(model_type, processor, config, rng)))


@pytest.mark.mmrope_applies("hunyuan_vl" in MODEL_TYPES, "HunYuan-VL")
def test_hunyuan_vl_counts_images_across_the_batch_as_its_model_does():
    """HunYuan-VL's image index runs over the whole batch: a sample's positions depend on the
    images of the samples before it. The engine gives the model's positions, alone and batched."""
    engine = engine_of("hunyuan_vl")
    processor, _ = built("hunyuan_vl")
    rng = random.Random(5)
    spec = examples.spec_of("hunyuan_vl")
    sample = examples.samples(spec, processor, rng)[0]
    outputs = [engine.process(**sample), engine.process(**sample)]
    ids, mask, inputs = engine.batch(outputs)
    batched, _ = engine.get_rope_index(ids, mask, **engine.rope_index_kwargs(inputs))
    alone, _ = engine.get_rope_index(*engine.batch(outputs[1:])[:2], **engine.rope_index_kwargs(engine.batch(outputs[1:])[2]))
    assert not torch.equal(batched[:, 1], alone[:, 0])  # the second sample's image is the batch's second
    assert_equal_to_own("hunyuan_vl", ids, mask, inputs)


# -- a model type this release of mmrope has never seen ------------------------------------------

@functools.cache
def future_models():
    """Two model types registered with transformers' auto classes, as a new release (or a model's
    own code) adds them: one doubles Qwen3-VL's positions (a rule no batched layout follows), one
    is a copy of Qwen3-VL under another name."""
    from transformers.models.qwen3_vl import Qwen3VLConfig, Qwen3VLModel

    class FutureDoubledConfig(Qwen3VLConfig):
        model_type = "mmrope_future_doubled_vl"

    class FutureDoubledModel(Qwen3VLModel):
        config_class = FutureDoubledConfig

        def get_rope_index(self, input_ids, mm_token_type_ids, image_grid_thw=None, video_grid_thw=None,
                           attention_mask=None, **kwargs):
            positions, deltas = Qwen3VLModel.get_rope_index(self, input_ids, mm_token_type_ids, image_grid_thw,
                                                            video_grid_thw, attention_mask)
            return positions * 2, deltas

    class FutureFramesConfig(Qwen3VLConfig):
        model_type = "mmrope_future_frames_vl"

    class FutureFramesModel(Qwen3VLModel):
        config_class = FutureFramesConfig

    for config_class, model_class in ((FutureDoubledConfig, FutureDoubledModel), (FutureFramesConfig, FutureFramesModel)):
        transformers.AutoConfig.register(config_class.model_type, config_class)
        transformers.AutoModel.register(config_class, model_class)
    return FutureDoubledConfig, FutureDoubledModel, FutureFramesConfig, FutureFramesModel


def future_case(config_class):
    spec = dataclasses.replace(examples.spec_of("qwen4_exp"), model_type="qwen3_vl")
    processor, _ = examples.build(spec)
    config = config_class()
    for key, token in spec.config_ids.items():
        setattr(config, key, processor.tokenizer.convert_tokens_to_ids(token))
    return processor, config


@pytest.mark.parametrize("which", ["own rule", "a known layout"])
def test_a_model_type_registered_after_this_release_works_through_its_own_method(manager, which, monkeypatch):
    from mmrope_core import reference as probing

    monkeypatch.setattr(probing, "_probed", {})
    doubled_config, doubled_model, frames_config, frames_model = future_models()
    config_class, model_class = (doubled_config, doubled_model) if which == "own rule" else (frames_config, frames_model)
    processor, config = future_case(config_class)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    assert engine.plugin_name == "transformers" and model_class.__name__ in engine.binding.description
    assert engine.implementation == ("reference" if which == "own rule" else "fast")
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == (1 if which == "own rule" else 0)
    rng = random.Random(which)
    for _ in range(5):
        batch = random_batch("qwen4_exp", processor, config, rng)
        ids, mask, inputs = split(batch)
        want, want_deltas = own_method(model_class, processor, config)(input_ids=ids, attention_mask=mask, **inputs)
        got, got_deltas = engine.get_rope_index(ids, mask, **engine.rope_index_kwargs(inputs))
        assert torch.equal(got, want) and torch.equal(got_deltas, want_deltas)


def own_method(model_class, processor, config):
    model = types.SimpleNamespace(config=config)
    for name in ("get_vision_position_ids", "get_rope_index"):
        setattr(model, name, types.MethodType(getattr(model_class, name), model))

    def call(input_ids, **inputs):
        types_ = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()))
        return model.get_rope_index(input_ids=input_ids, mm_token_type_ids=types_, **inputs)

    return call
