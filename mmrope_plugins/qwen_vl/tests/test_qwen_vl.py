"""mmrope-qwen-vl against the installed transformers reference, with real processors."""

import functools
import inspect
import random
import types

import pytest
import torch
import transformers

from mmrope_core import InvalidInputError, PlaceholderMismatchError, PluginManager, RopeEngine
from mmrope_core.tiny import processors_without_torchvision
from mmrope_qwen_vl.samples import random_batch

# (example family, config model_type): every model class the plugin binds
MODELS = [
    ("Qwen2-VL", "qwen2_vl"),
    ("Qwen2.5-VL", "qwen2_5_vl"),
    ("Qwen3-VL", "qwen3_vl"),
    ("Qwen3-VL", "qwen3_vl_moe"),
    ("Qwen3.5", "qwen3_5"),
    ("Qwen3.5", "qwen3_5_moe"),
    ("GLM-4V", "glm4v"),
    ("GLM-4V", "glm4v_moe"),
    ("GLM-4.6V", "glm46v"),
]
# config model_type -> the model class whose get_rope_index is the reference
MODEL_CLASSES = {
    "qwen2_vl": "Qwen2VLModel", "qwen2_5_vl": "Qwen2_5_VLModel", "qwen3_vl": "Qwen3VLModel",
    "qwen3_vl_moe": "Qwen3VLMoeModel", "qwen3_5": "Qwen3_5Model", "qwen3_5_moe": "Qwen3_5MoeModel",
    "glm4v": "Glm4vModel", "glm4v_moe": "Glm4vMoeModel", "glm46v": "Glm46VModel",
}
BATCHES_PER_MODEL = 150


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl"})


@functools.cache
def example(name):
    from mmrope_qwen_vl.examples import example_cases

    return next(case for case in example_cases() if case.name == name)


@functools.cache
def built(name, model_type):
    processor, _ = example(name).build()
    return processor, transformers.AutoConfig.for_model(model_type)


def engines(manager, name, model_type):
    processor, config = built(name, model_type)
    fast = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    reference = RopeEngine.from_processor(processor, config, plugin_manager=manager, implementation="reference")
    return fast, reference


def transformers_reference(config):
    """The model's own get_rope_index, bound to the config, without mmrope."""
    model_cls = getattr(transformers, MODEL_CLASSES[config.model_type])
    namespace = types.SimpleNamespace(config=config)
    for method in ("get_vision_position_ids", "get_rope_index"):
        setattr(namespace, method, types.MethodType(getattr(model_cls, method), namespace))
    return namespace.get_rope_index


def models_own(name, model_type):
    """``get_rope_index(ids, mask, **inputs)`` of the model class itself, without mmrope: the
    inputs its signature names, token types from the processor's ``create_mm_token_type_ids``."""
    processor, config = built(name, model_type)
    get_rope_index = transformers_reference(config)
    takes = inspect.signature(get_rope_index).parameters

    def call(ids, mask, **inputs):
        kwargs = {key: value for key, value in inputs.items() if key in takes and key != "mm_token_type_ids"}
        if "mm_token_type_ids" in takes:
            kwargs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))
        return get_rope_index(input_ids=ids, attention_mask=mask, **kwargs)

    return call


def split(batch):
    return batch["input_ids"], batch["attention_mask"], {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask")}


@pytest.mark.differential
@pytest.mark.parametrize("name, model_type", MODELS)
def test_fast_binding_is_used_on_this_transformers(manager, name, model_type):
    fast, reference = engines(manager, name, model_type)
    assert fast.implementation == "fast", fast.binding.description
    assert reference.implementation == "reference"


@pytest.mark.differential
@pytest.mark.parametrize("name, model_type", MODELS)
def test_real_processor_output_gives_the_models_own_positions(manager, name, model_type):
    processor, config = built(name, model_type)
    fast, _ = engines(manager, name, model_type)
    for seed in range(5):
        from mmrope_qwen_vl.examples import image_prompt

        batch = processor(**image_prompt(processor, random.Random(seed)))
        ids, mask, inputs = split(dict(batch))
        want_positions, want_deltas = transformers_reference(config)(
            input_ids=ids, mm_token_type_ids=inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"],
            attention_mask=mask,
        )
        positions = fast.compute_position_ids(ids, mask, inputs)
        assert torch.equal(positions[:, 1:], want_positions.transpose(0, 1))
        got_positions, got_deltas = fast.get_rope_index(ids, mask, image_grid_thw=inputs["image_grid_thw"])
        assert torch.equal(got_positions, want_positions) and torch.equal(got_deltas, want_deltas)


@pytest.mark.differential
@pytest.mark.parametrize("name, model_type", MODELS)
def test_fast_equals_reference_on_generated_batches(manager, name, model_type):
    processor, _ = built(name, model_type)
    fast, _ = engines(manager, name, model_type)
    reference = models_own(name, model_type)
    rng = random.Random(f"{name}/{model_type}")
    for index in range(BATCHES_PER_MODEL):
        batch = random_batch(processor, rng)
        ids, mask, inputs = split(batch)
        assert_same_positions(fast, reference, ids, mask, inputs, f"batch {index}")
        placed, (want, _) = fast.compute_position_ids(ids, mask, inputs), reference(ids, mask, **inputs)
        assert torch.equal(placed[:, 1:], want.transpose(0, 1)), f"batch {index}"
        assert torch.equal(placed[:, 0], (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)), f"batch {index}"


@pytest.mark.differential
@pytest.mark.parametrize("name, model_type", MODELS)
def test_fast_equals_reference_when_media_touch_the_row_edges(manager, name, model_type):
    """Samples that begin or end with a placeholder run, rows of odd lengths above 1000 tokens."""
    processor, _ = built(name, model_type)
    fast, _ = engines(manager, name, model_type)
    reference = models_own(name, model_type)
    rng = random.Random(f"edges/{name}/{model_type}")
    for index in range(30):
        batch = random_batch(processor, rng, bare_edges=True, min_length=2 * rng.randint(500, 1500) + 1)
        ids, mask, inputs = split(batch)
        assert_same_positions(fast, reference, ids, mask, inputs, f"batch {index}")
        whole = torch.ones_like(mask)  # no padding: a run ending one row touches the next row's
        for row in range(ids.shape[0]):
            ids[row] = ids[row].roll(-int(mask[row].argmax()) if mask[row, 0] == 0 else 0)
        assert_same_positions(fast, reference, ids, whole, inputs, f"batch {index} without padding")


@pytest.mark.differential
@pytest.mark.parametrize("name, model_type", MODELS[:3] + MODELS[6:7])
def test_fast_equals_reference_with_padding_inside_samples(manager, name, model_type):
    """Masked tokens inserted anywhere in a sample, inside placeholder runs too: the reference
    drops them, so a run they interrupt is still one run."""
    processor, _ = built(name, model_type)
    fast, _ = engines(manager, name, model_type)
    reference = models_own(name, model_type)
    rng = random.Random(f"holes/{name}/{model_type}")
    for index in range(40):
        batch = random_batch(processor, rng, max_batch=6)
        ids, mask, inputs = split(batch)
        holes = torch.rand(ids.shape, generator=torch.Generator().manual_seed(index)) < 0.1
        ids = torch.stack([_with_masked_tokens(row, at, processor) for row, at in zip(ids, holes)])
        mask = torch.stack([_with_masked_tokens(row, at, None) for row, at in zip(mask, holes)])
        assert_same_positions(fast, reference, ids, mask, inputs, f"batch {index}")


@pytest.mark.differential
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64])
def test_fast_equals_reference_whatever_the_dtype_of_second_per_grid_ts(manager, dtype):
    """Temporal ids are ``trunc(frame * tokens_per_second * seconds)`` in the dtype torch promotes
    to; the kernel computes some dtypes in numpy and must round as torch does."""
    processor, _ = built("Qwen2.5-VL", "qwen2_5_vl")
    fast, _ = engines(manager, "Qwen2.5-VL", "qwen2_5_vl")
    reference = models_own("Qwen2.5-VL", "qwen2_5_vl")
    rng = random.Random(f"seconds/{dtype}")
    checked = 0
    while checked < 25:
        batch = random_batch(processor, rng, max_videos=3)
        if "second_per_grid_ts" not in batch:
            continue
        seconds = batch["second_per_grid_ts"].double() * rng.choice([1, 3.7, 11.3])
        batch["second_per_grid_ts"] = (seconds.round() if dtype == torch.int64 else seconds).to(dtype)
        ids, mask, inputs = split(batch)
        assert_same_positions(fast, reference, ids, mask, inputs, f"{dtype} batch {checked}")
        checked += 1


def assert_same_positions(fast, reference, ids, mask, inputs, what):
    """``reference``: the model's own method (:func:`models_own`)."""
    want = reference(ids, mask, **inputs)
    got = fast.get_rope_index(ids, mask, **inputs)
    context = f"{what}: {tuple(ids.shape)}, grids {inputs}"
    assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype, context
    assert torch.equal(got[0], want[0]), context
    assert torch.equal(got[1], want[1]), context


def _with_masked_tokens(row, at, processor):
    """``row`` with a token inserted before each position in ``at``: a masked image token for
    ids (``processor`` given), 0 for the mask."""
    out = []
    for value, insert in zip(row.tolist(), at.tolist()):
        if insert:
            out.append(processor.image_token_id if processor is not None else 0)
        out.append(value)
    out += [processor.tokenizer.pad_token_id if processor is not None else 0] * (2 * len(row) - len(out))
    return torch.tensor(out)


def test_positions_are_ordinary_tensors_the_caller_may_change(manager):
    processor, _ = built("Qwen2-VL", "qwen2_vl")
    fast, _ = engines(manager, "Qwen2-VL", "qwen2_vl")
    ids, mask, inputs = split(random_batch(processor, random.Random(3)))
    positions, deltas = fast.get_rope_index(ids, mask, **inputs)
    placed = fast.compute_position_ids(ids, mask, inputs)
    kept = positions.clone(), deltas.clone(), placed.clone()
    positions += 1
    deltas -= 1
    placed.add_(1)  # no cache or buffer of the engine's is shared with the caller
    again = fast.get_rope_index(ids, mask, **inputs) + (fast.compute_position_ids(ids, mask, inputs),)
    assert all(torch.equal(a, b) for a, b in zip(again, kept))


@pytest.mark.differential
def test_glm_token_types_are_the_processors_own(manager):
    """GLM's image token is a video token inside video markers: the engine's token types equal
    what the processor's create_mm_token_type_ids gives, unbalanced markers and rows without
    video included."""
    processor, _ = built("GLM-4V", "glm4v")
    fast, _ = engines(manager, "GLM-4V", "glm4v")
    image, start, end = processor.image_token_id, processor.video_start_id, processor.video_end_id
    text = [i for i in range(40) if i not in (image, start, end)]
    rng = random.Random("glm token types")
    for index in range(60):
        rows, length = rng.randint(1, 4), rng.randint(1, 300)
        markers = index % 3 != 0  # one batch in three has no video marker
        weights = [8, 1, 1, 6] if markers else [8, 0, 0, 6]
        ids = torch.tensor([[rng.choices([image, start, end, rng.choice(text)], weights)[0] for _ in range(length)]
                            for _ in range(rows)])
        want = torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))
        got = fast.binding.kernel.token_types(ids)
        assert got.dtype == torch.int8 and torch.equal(got.long(), want.long()), f"batch {index}"
        # the rows packed into one: each segment typed as its row alone, open markers included
        lengths = torch.full((rows,), length)
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        got = fast.binding.kernel.token_types(ids.reshape(1, -1), cu_seqlens)
        assert got.dtype == torch.int8 and torch.equal(got.long(), want.reshape(1, -1).long()), f"packed batch {index}"


def test_generated_batches_cover_what_the_tests_claim(manager):
    processor, _ = built("Qwen2.5-VL", "qwen2_5_vl")
    rng = random.Random("coverage")
    batches = [random_batch(processor, rng) for _ in range(BATCHES_PER_MODEL)]
    left = sum(bool(b["attention_mask"][:, 0].lt(1).any()) for b in batches)
    right = sum(bool(b["attention_mask"][:, -1].lt(1).any()) for b in batches)
    seconds = torch.cat([b["second_per_grid_ts"] for b in batches if "second_per_grid_ts" in b])
    frames = torch.cat([b["video_grid_thw"][:, 0] for b in batches if "video_grid_thw" in b])
    assert left > 20 and right > 20
    assert bool((seconds != seconds.round()).any()) and int(frames.max()) >= 12
    assert max(b["input_ids"].shape[0] for b in batches) >= 12


def test_caller_data_is_not_changed(manager):
    processor, _ = built("Qwen3-VL", "qwen3_vl")
    fast, reference = engines(manager, "Qwen3-VL", "qwen3_vl")
    batch = random_batch(processor, random.Random(3), max_videos=2)
    before = {key: value.clone() for key, value in batch.items()}
    for engine in (fast, reference):
        engine.compute_position_ids(*split(batch))
    assert all(torch.equal(before[key], batch[key]) for key in batch)


def test_default_config_uses_the_processors_merge_size(manager):
    processor, config = built("Qwen2-VL", "qwen2_vl")
    without = RopeEngine.from_processor(processor, None, plugin_manager=manager)
    with_config = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    batch = random_batch(processor, random.Random(0))
    assert torch.equal(without.compute_position_ids(*split(batch)), with_config.compute_position_ids(*split(batch)))


def test_from_pretrained_reads_a_saved_processor_and_config(manager, tmp_path):
    processor, config = built("Qwen2.5-VL", "qwen2_5_vl")
    processor.save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    with processors_without_torchvision():
        loaded = RopeEngine.from_pretrained(str(tmp_path), plugin_manager=manager)
    assert type(loaded.processor).__name__ == "Qwen2_5_VLProcessor" and loaded.plugin_name == "qwen_vl"
    fast, _ = engines(manager, "Qwen2.5-VL", "qwen2_5_vl")
    batch = random_batch(processor, random.Random(1))
    assert torch.equal(loaded.compute_position_ids(*split(batch)), fast.compute_position_ids(*split(batch)))


def test_a_config_of_another_family_is_refused(manager):
    processor, _ = built("Qwen2-VL", "qwen2_vl")
    with pytest.raises(InvalidInputError, match=r"Qwen2-VL.*model_type 'qwen3_vl'"):
        RopeEngine.from_processor(processor, transformers.AutoConfig.for_model("qwen3_vl"), plugin_manager=manager)


def test_an_unknown_implementation_is_refused(manager):
    processor, config = built("Qwen2-VL", "qwen2_vl")
    with pytest.raises(InvalidInputError, match=r"implementation='turbo'.*'fast', 'reference'"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, implementation="turbo")


def test_an_engine_on_a_transformers_whose_semantics_changed_uses_its_reference(monkeypatch, manager):
    """No install-time cap on transformers: a release whose get_rope_index differs from the fast
    kernel gets the reference, one warning, and that release's positions."""
    from transformers.models.qwen2_vl import Qwen2VLModel

    from mmrope_core import reference as probing

    monkeypatch.setattr(probing, "_probed", {})
    original = Qwen2VLModel.get_rope_index

    @functools.wraps(original)
    def changed(self, *args, **kwargs):  # stands for a future release: text resumes one later after media
        positions, deltas = original(self, *args, **kwargs)
        return positions + (positions > 0), deltas

    monkeypatch.setattr(Qwen2VLModel, "get_rope_index", changed)
    processor, config = built("Qwen2-VL", "qwen2_vl")
    with pytest.warns(RuntimeWarning, match="batched Qwen2-VL kernel does not reproduce transformers"):
        engine = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    assert engine.implementation == "reference" and "disagrees" in engine.binding.description
    batch = random_batch(processor, random.Random(3), max_videos=1)
    ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
    grids = {key: value for key, value in batch.items() if key.endswith("grid_thw") and value is not None}
    positions, _ = engine.get_rope_index(ids, mask, **grids)
    model = probing.config_only_model(Qwen2VLModel, config)
    want, _ = model.get_rope_index(input_ids=ids, mm_token_type_ids=engine.binding.kernel.token_types(ids),
                                   attention_mask=mask, **grids)
    assert torch.equal(positions, want)


# -- bad inputs: typed errors from both implementations ------------------------------------------

def image_batch(processor, counts=(2, 1)):
    tokenizer = processor.tokenizer
    start, end = tokenizer.convert_tokens_to_ids([tokenizer.vision_start_token, tokenizer.vision_end_token])
    image, word = processor.image_token_id, tokenizer.convert_tokens_to_ids("cat")
    rows = []
    for count in counts:
        rows.append([word] * 3 + ([start] + [image] * 4 + [end] + [word]) * count)
    length = max(map(len, rows))
    ids = torch.tensor([row + [tokenizer.pad_token_id] * (length - len(row)) for row in rows])
    mask = (torch.arange(length) < torch.tensor([len(r) for r in rows])[:, None]).long()
    return ids, mask, torch.tensor([[1, 4, 4]] * sum(counts))


@pytest.fixture(params=["fast", "reference"])
def qwen2_engine(manager, request):
    processor, config = built("Qwen2-VL", "qwen2_vl")
    return processor, RopeEngine.from_processor(processor, config, plugin_manager=manager, implementation=request.param)


def test_a_truncated_image_run_names_the_sample_and_counts(qwen2_engine):
    processor, engine = qwen2_engine
    ids, mask, grids = image_batch(processor)
    mask[1, 6:] = 0  # sample 1 cut inside its image
    with pytest.raises(PlaceholderMismatchError, match=r"sample 1, image 0: the grid \(1, 4, 4\) needs 4 .* found 2.*truncated"):
        engine.get_rope_index(ids, mask, image_grid_thw=grids)


def test_a_placeholder_sampled_in_a_response_has_no_grid(qwen2_engine):
    processor, engine = qwen2_engine
    ids, mask, grids = image_batch(processor)
    ids[1, 1] = processor.image_token_id
    with pytest.raises(PlaceholderMismatchError, match=r"sample 1: a run of 1 .* has no image grid"):
        engine.get_rope_index(ids, mask, image_grid_thw=grids)


def test_grids_left_over_are_reported(qwen2_engine):
    processor, engine = qwen2_engine
    ids, mask, grids = image_batch(processor)
    with pytest.raises(PlaceholderMismatchError, match=r"image_grid_thw has 4 rows but the batch holds only 3 .*per sample: \[2, 1\]"):
        engine.get_rope_index(ids, mask, image_grid_thw=torch.cat([grids, grids[:1]]))


def test_video_tokens_without_video_grids(qwen2_engine):
    processor, engine = qwen2_engine
    ids, mask, grids = image_batch(processor)
    ids[0, 4:8] = processor.video_token_id
    with pytest.raises(PlaceholderMismatchError, match=r"sample 0: a run of 4 .* has no video grid"):
        engine.get_rope_index(ids, mask, image_grid_thw=grids[1:])


@pytest.mark.parametrize(
    "grid, message",
    [
        ([[1, 4, 3]], r"row 0 is \(1, 4, 3\).*divisible by the spatial merge size 2"),
        ([[0, 4, 4]], "every size must be positive"),
        ([[1, -4, 4]], "every size must be positive"),
    ],
)
def test_invalid_grids(qwen2_engine, grid, message):
    processor, engine = qwen2_engine
    ids, mask, _ = image_batch(processor, counts=(1,))
    with pytest.raises(InvalidInputError, match=message):
        engine.get_rope_index(ids, mask, image_grid_thw=torch.tensor(grid))


def test_grids_as_lists_are_refused_with_a_fix(qwen2_engine):
    processor, engine = qwen2_engine
    ids, mask, grids = image_batch(processor, counts=(1,))
    with pytest.raises(InvalidInputError, match=r"image_grid_thw must be a tensor.*torch.as_tensor"):
        engine.get_rope_index(ids, mask, image_grid_thw=grids.tolist())


def test_empty_video_grids_and_seconds_are_no_videos(manager):
    """A collator may hand over (0, 3) video grids and no seconds for a batch without videos."""
    processor, _ = built("Qwen2.5-VL", "qwen2_5_vl")
    fast, _ = engines(manager, "Qwen2.5-VL", "qwen2_5_vl")
    reference = models_own("Qwen2.5-VL", "qwen2_5_vl")
    ids, mask, grids = image_batch(processor, counts=(1, 2))
    inputs = {"image_grid_thw": grids, "video_grid_thw": torch.zeros(0, 3, dtype=torch.long),
              "second_per_grid_ts": torch.zeros(0)}
    assert_same_positions(fast, reference, ids, mask, inputs, "empty video grids")
    assert torch.equal(fast.get_rope_index(ids, mask, **inputs)[0], fast.get_rope_index(ids, mask, image_grid_thw=grids)[0])


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize(
    "seconds, message",
    [
        (torch.tensor([0.5, 1.0]), "2 values for 1 video in"),
        (torch.tensor([float("nan")]), "non-finite"),
        (torch.tensor([float("inf")]), "non-finite"),
        (torch.tensor([-1.0]), "negative"),
    ],
)
def test_bad_second_per_grid_ts(manager, impl, seconds, message):
    processor, config = built("Qwen2.5-VL", "qwen2_5_vl")
    engine = RopeEngine.from_processor(processor, config, plugin_manager=manager, implementation=impl)
    tokenizer = processor.tokenizer
    start, end = tokenizer.convert_tokens_to_ids([tokenizer.vision_start_token, tokenizer.vision_end_token])
    ids = torch.tensor([[start] + [processor.video_token_id] * 8 + [end]])
    with pytest.raises(InvalidInputError, match=message):
        engine.get_rope_index(ids, video_grid_thw=torch.tensor([[2, 4, 4]]), second_per_grid_ts=seconds)


def test_the_plugin_conforms(mmrope_conformance):
    mmrope_conformance("qwen_vl")


def test_a_config_timing_videos_by_no_rule_binds_the_reference():
    """A ``tokens_per_second`` no temporal rule takes (negative) is the config's: the reference
    computes what the model would, and the batched kernel is not bound for it."""
    from mmrope_qwen_vl.examples import build

    processor, config = build("Qwen2.5-VL")
    config.vision_config.tokens_per_second = -1
    with pytest.warns(RuntimeWarning, match="reference implementation is used"):
        engine = RopeEngine.from_processor(processor, config)
    assert engine.binding.implementation == "reference"


@pytest.mark.differential
def test_an_image_of_several_frames_keeps_its_frame_numbers_beside_timed_videos(manager):
    """The reference spaces out only videos in time: an image's frames sit at their index,
    whatever tokens_per_second and the videos' seconds."""
    processor, _ = built("Qwen2.5-VL", "qwen2_5_vl")
    fast, _ = engines(manager, "Qwen2.5-VL", "qwen2_5_vl")
    reference = models_own("Qwen2.5-VL", "qwen2_5_vl")
    tokenizer = processor.tokenizer
    start, end = tokenizer.convert_tokens_to_ids([tokenizer.vision_start_token, tokenizer.vision_end_token])
    word, image, video = tokenizer.convert_tokens_to_ids("cat"), processor.image_token_id, processor.video_token_id
    ids = torch.tensor([[word] * 3 + [start] + [image] * 12 + [end, word, start] + [video] * 8 + [end, word]])
    inputs = {"image_grid_thw": torch.tensor([[3, 4, 4]]), "video_grid_thw": torch.tensor([[2, 4, 4]]),
              "second_per_grid_ts": torch.tensor([1.5])}
    assert_same_positions(fast, reference, ids, torch.ones_like(ids), inputs, "an image of 3 frames")
