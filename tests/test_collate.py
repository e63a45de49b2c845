"""Batching per-sample multimodal inputs."""

import pytest
import torch

from mmrope_core import CollateError
from mmrope_core.processor_outputs import collate


def test_varlen_keys_are_zero_padded_on_the_last_dim_then_concatenated():
    a = {"input_features": torch.ones(1, 4, 3), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    b = {"input_features": torch.full((2, 4, 6), 2.0), "image_grid_thw": torch.tensor([[1, 4, 4], [1, 2, 4]])}
    batch = collate([a, b], varlen_keys={"input_features"})
    assert batch["input_features"].shape == (3, 4, 6)
    assert batch["input_features"][0, :, 3:].eq(0).all()
    assert batch["input_features"][1:].eq(2).all()
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 4], [1, 2, 4]]
    assert a["input_features"].shape == (1, 4, 3)  # inputs untouched


def test_keys_missing_from_some_samples_concatenate_over_the_others():
    batch = collate([{"pixel_values": torch.ones(4, 2)}, {}, {"pixel_values": torch.zeros(2, 2)}])
    assert batch["pixel_values"].shape == (6, 2)


def test_lists_are_concatenated():
    assert collate([{"second_per_grid_ts": [0.5]}, {"second_per_grid_ts": [1.0, 2.0]}]) == {"second_per_grid_ts": [0.5, 1.0, 2.0]}


def test_a_shape_mismatch_names_the_key_and_the_shapes():
    with pytest.raises(CollateError) as caught:
        collate([{"input_features": torch.ones(1, 4, 3)}, {"input_features": torch.ones(1, 4, 5)}])
    message = str(caught.value)
    assert "'input_features'" in message and "sample 0: (1, 4, 3), sample 1: (1, 4, 5)" in message
    assert "varlen_keys" in message


def test_varlen_tensors_of_different_rank_are_refused():
    with pytest.raises(CollateError, match="different ranks"):
        collate([{"mask": torch.ones(1, 3)}, {"mask": torch.ones(3)}], varlen_keys={"mask"})


def test_values_that_cannot_be_batched_are_named():
    with pytest.raises(CollateError, match="'metadata'.*dict, str"):
        collate([{"metadata": "x"}, {"metadata": {"fps": 2}}])


def test_collate_takes_an_iterable_of_dicts():
    with pytest.raises(CollateError, match="iterable of per-sample dicts, got dict"):
        collate({"pixel_values": torch.ones(1)})
    with pytest.raises(CollateError, match="sample 1 is an int"):
        collate([{}, 3])
    samples = [{"pixel_values": torch.ones(1, 2)}, {"pixel_values": torch.zeros(2, 2)}]
    assert torch.equal(collate(sample for sample in samples)["pixel_values"], collate(samples)["pixel_values"])


def test_a_value_of_none_counts_as_missing():
    batched = collate([{"pixel_values": torch.ones(1, 2), "image_grid_thw": None},
                       {"pixel_values": None, "image_grid_thw": torch.tensor([[1, 2, 2]])},
                       {"pixel_values": None, "video_grid_thw": None}])
    assert sorted(batched) == ["image_grid_thw", "pixel_values"]
    assert torch.equal(batched["pixel_values"], torch.ones(1, 2))
    assert torch.equal(batched["image_grid_thw"], torch.tensor([[1, 2, 2]]))


def test_varlen_tensors_are_padded_in_every_dimension_but_the_batch_one():
    short = {"input_features": torch.ones(1, 3, 4), "input_features_mask": torch.ones(1, 3, dtype=torch.bool)}
    long = {"input_features": torch.ones(2, 5, 4), "input_features_mask": torch.ones(2, 5, dtype=torch.bool)}
    batch = collate([short, long], varlen_keys={"input_features", "input_features_mask"})
    assert batch["input_features"].shape == (3, 5, 4)
    assert batch["input_features"][0, 3:].eq(0).all() and batch["input_features"][0, :3].eq(1).all()
    assert batch["input_features_mask"].tolist()[0] == [True, True, True, False, False]


@pytest.mark.parametrize("side", ["left", "right"])
def test_token_types_are_padded_on_the_side_of_the_tokens(side):
    from mmrope_core.processor_outputs import batch_processor_outputs

    outputs = [{"input_ids": torch.tensor([[7, 8, 9]]), "mm_token_type_ids": torch.tensor([[0, 1, 0]]),
                "input_features_mask": torch.ones(1, 5, dtype=torch.bool)},
               {"input_ids": torch.tensor([[7, 9]]), "mm_token_type_ids": torch.tensor([[1, 1]]),
                "input_features_mask": torch.ones(1, 2, dtype=torch.bool)}]
    ids, mask, inputs = batch_processor_outputs(outputs, {"mm_token_type_ids", "input_features_mask"},
                                                pad_token_id=5, padding_side=side)
    types = inputs["mm_token_type_ids"]
    assert types.shape == ids.shape
    # every token keeps its own type, padding holds 0, whichever side the padding is on
    assert torch.equal(types[mask.bool()], torch.tensor([0, 1, 0, 1, 1]))
    assert types[~mask.bool()].eq(0).all()
    # a varlen key not aligned with the tokens is padded at its end
    assert inputs["input_features_mask"].tolist()[1] == [True, True, False, False, False]


def _outputs(*masks):
    return [{"input_ids": torch.arange(1, mask.numel() + 1).unsqueeze(0), "attention_mask": mask,
             "image_grid_thw": torch.tensor([[1, 2, 2]])} for mask in masks]


def test_batch_takes_any_iterable_of_outputs():
    from mmrope_core.processor_outputs import batch_processor_outputs

    outputs = _outputs(torch.tensor([[1, 1, 1]]), torch.tensor([[1, 1]]))
    from_list = batch_processor_outputs(outputs)
    from_generator = batch_processor_outputs(output for output in outputs)
    for got, want in zip(from_generator[:2], from_list[:2]):
        assert torch.equal(got, want)
    assert torch.equal(from_generator[2]["image_grid_thw"], torch.tensor([[1, 2, 2], [1, 2, 2]]))


@pytest.mark.parametrize("side", ["left", "right"])
def test_batch_keeps_each_sample_s_mask_whether_l_or_1_l(side):
    from mmrope_core.processor_outputs import batch_processor_outputs

    masks = (torch.tensor([1, 1, 0]), torch.tensor([[0, 1, 1, 1]]), torch.tensor([1, 1]))
    ids, mask, _ = batch_processor_outputs(_outputs(*masks), padding_side=side)
    for row, given in enumerate(masks):
        given = given.reshape(-1)
        span = slice(4 - given.numel(), 4) if side == "left" else slice(0, given.numel())
        assert torch.equal(mask[row, span], given)
        assert torch.equal(ids[row, span], torch.arange(1, given.numel() + 1))
        assert int(mask[row].sum()) == int(given.sum())


@pytest.mark.parametrize("mask, message", [
    (torch.ones(2, 3, dtype=torch.long), r"sample 0: attention_mask must be \(1, L\) or \(L,\) per sample, got \(2, 3\)"),
    (torch.ones(1, 2, dtype=torch.long), "sample 0: attention_mask has 2 values for 3 input_ids"),
    (torch.ones(1, 1, 3, dtype=torch.long), r"got \(1, 1, 3\)"),
])
def test_batch_refuses_masks_that_are_not_one_row_of_its_ids(mask, message):
    from mmrope_core.processor_outputs import batch_processor_outputs

    outputs = [{"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": mask}]
    with pytest.raises(CollateError, match=message):
        batch_processor_outputs(outputs)
    assert outputs[0]["attention_mask"] is mask


def test_batch_refuses_tensors_without_values():
    from mmrope_core.processor_outputs import batch_processor_outputs
    from mmrope_core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="sample 1: input_ids is on the meta device"):
        batch_processor_outputs([{"input_ids": torch.tensor([[5, 6]])}, {"input_ids": torch.ones(1, 2, device="meta")}])


def test_batch_ids_take_a_dtype_that_holds_every_sample():
    from mmrope_core.processor_outputs import batch_processor_outputs

    outputs = [{"input_ids": torch.tensor([1, 2, 3], dtype=torch.uint8)}, {"input_ids": torch.tensor([[1, 2, 151655]])}]
    ids, _, _ = batch_processor_outputs(outputs)
    assert ids.dtype == torch.int64 and ids[1].tolist() == [1, 2, 151655]
    with pytest.raises(CollateError, match="sample 0: input_ids must hold integer token ids, got torch.float32"):
        batch_processor_outputs([{"input_ids": torch.ones(1, 3)}])


@pytest.mark.parametrize("side", ["left", "right"])
def test_token_types_given_as_l_rows_are_padded_with_their_tokens(side):
    from mmrope_core.processor_outputs import batch_processor_outputs

    outputs = [{"input_ids": torch.tensor([5, 6, 7]), "mm_token_type_ids": torch.tensor([0, 1, 0])},
               {"input_ids": torch.tensor([[5, 6]]), "mm_token_type_ids": torch.tensor([[1, 1]])}]
    _, _, inputs = batch_processor_outputs(outputs, {"mm_token_type_ids"}, padding_side=side)
    want = [[0, 1, 0], [1, 1, 0]] if side == "right" else [[0, 1, 0], [0, 1, 1]]
    assert inputs["mm_token_type_ids"].tolist() == want


# -- keys batched by their family's own rule (mmrope_core.batching) ---------------------------------


def test_strips_are_joined_on_the_last_dim_into_one():
    from mmrope_core import MediaKey

    strips = [{"pixel_values": torch.full((1, 3, 2, width), float(width))} for width in (4, 6)]
    batch = collate(strips, varlen_keys={"pixel_values"}, media={"pixel_values": MediaKey(join="last")})
    assert batch["pixel_values"].shape == (1, 3, 2, 10)
    assert batch["pixel_values"][..., :4].eq(4).all() and batch["pixel_values"][..., 4:].eq(6).all()
    with pytest.raises(CollateError, match="joins each sample's"):
        collate([{"pixel_values": torch.ones(2, 3, 2, 4)}], media={"pixel_values": MediaKey(join="last")})


def test_every_sample_gets_a_row_of_the_batchs_items_and_empty_slots_take_their_value():
    from mmrope_core import MediaKey
    from mmrope_core.batching import first_item_slot

    rules = {"masks": MediaKey(items_dim=1, empty_item=first_item_slot),
             "cross": MediaKey(items_dim=2, token_dim=1)}
    samples = [{"masks": torch.tensor([[[1, 1, 0]]]), "cross": torch.ones(1, 2, 1, 3, dtype=torch.long)},
               {},
               {"masks": torch.tensor([[[1, 0, 0], [1, 1, 1]]]), "cross": torch.full((1, 3, 2, 3), 2)}]
    before = {key: value.clone() for key, value in samples[0].items()}
    batch = collate(samples, media=rules, padding_side="left", lengths=[4, 4, 4])
    assert batch["masks"].tolist() == [[[1, 1, 0], [1, 0, 0]], [[1, 0, 0], [1, 0, 0]], [[1, 0, 0], [1, 1, 1]]]
    cross = batch["cross"]
    assert cross.shape == (3, 4, 2, 3)
    assert cross[0, 2:, 0].eq(1).all() and cross[0, :2].eq(0).all() and cross[0, :, 1].eq(0).all()  # padded left
    assert cross[1].eq(0).all() and cross[2, 1:].eq(2).all() and cross[2, 0].eq(0).all()
    assert all(torch.equal(samples[0][key], value) for key, value in before.items())  # inputs untouched


def test_a_key_placed_per_row_or_read_once_per_batch_refuses_a_mixed_batch():
    from mmrope_core import MediaKey

    with pytest.raises(CollateError, match=r"sample 1 has no 'pixel_values', which samples \[0, 2\] hold"):
        collate([{"pixel_values": torch.ones(1, 2)}, {}, {"pixel_values": torch.ones(1, 2)}],
                media={"pixel_values": MediaKey(per_row=True)})
    with pytest.raises(CollateError, match=r"samples 0 and 1 differ in 'count' \(\[1\] and none\)"):
        collate([{"count": torch.tensor([1])}, {}], media={"count": MediaKey(uniform=True)})
    same = collate([{"count": torch.tensor([2])}, {"count": torch.tensor([2])}], media={"count": MediaKey(uniform=True)})
    assert same["count"].tolist() == [2, 2]
    # equal values that are not tensors are refused for what they are, not as differing
    with pytest.raises(CollateError, match=r"key 'count' must hold a tensor"):
        collate([{"count": [2]}, {"count": [2]}], media={"count": MediaKey(uniform=True)})


def test_indices_into_another_keys_entries_are_shifted_past_the_samples_before():
    from mmrope_core import MediaKey

    rules = {"pooling": MediaKey(indexes="patches")}
    samples = [{"patches": torch.zeros(2, 3, 5), "pooling": torch.tensor([[0, 5], [-1, 1]])},
               {"input_ids": torch.tensor([[4]])},  # no patches: the next sample's indices follow on
               {"patches": torch.zeros(1, 3, 5), "pooling": torch.tensor([[2, -1]])}]
    batch = collate(samples, media=rules)
    assert batch["pooling"].tolist() == [[0, 5], [-1, 1], [8, -1]]  # 2 x 3 patches before the last sample's
    assert samples[2]["pooling"].tolist() == [[2, -1]]  # inputs untouched
    with pytest.raises(CollateError, match=r"sample 0: 'pooling' indexes the entries of 'patches'"):
        collate([{"patches": [1, 2], "pooling": torch.tensor([[0]])}], media=rules)
def test_entries_added_where_samples_differ_take_the_keys_pad_value():
    from mmrope_core import MediaKey

    masks = [{"crops": torch.full((1, 1, 2), 7)}, {"crops": torch.full((1, 2, 2), 7)}]
    batch = collate(masks, media={"crops": MediaKey(pad_value=1)})
    assert batch["crops"].tolist() == [[[7, 7], [1, 1]], [[7, 7], [7, 7]]]


def test_a_key_switched_by_another_refuses_a_sample_without_it_beside_one_with_it():
    from mmrope_core import MediaKey

    rules = {"audio": MediaKey(switched_by="images")}
    with pytest.raises(CollateError, match=r"sample 1 holds 'audio' without 'images', which sample 0 holds"):
        collate([{"images": torch.ones(1, 2)}, {"audio": torch.ones(1, 3)}], media=rules)
    # with it, or in a batch without it, the sample takes the key as alone
    both = collate([{"images": torch.ones(1, 2), "audio": torch.ones(1, 3)}, {"images": torch.ones(1, 2)}], media=rules)
    assert both["audio"].shape == (1, 3)
    assert collate([{"audio": torch.ones(1, 3)}, {}], media=rules)["audio"].shape == (1, 3)


def test_a_batch_layout_checks_itself():
    from mmrope_core import BatchLayout, MediaKey

    with pytest.raises(TypeError, match="join"):
        MediaKey(join="first")
    with pytest.raises(TypeError, match="dim >= 1"):
        MediaKey(items_dim=0)
    with pytest.raises(TypeError, match="needs items_dim"):
        MediaKey(empty_item=lambda shape, dtype: torch.zeros(shape, dtype=dtype))
    with pytest.raises(TypeError, match="pad_value must be a number"):
        MediaKey(pad_value="1")
    with pytest.raises(TypeError, match="reason"):
        BatchLayout(refused_sides={"left": ""})
    with pytest.raises(TypeError, match="indexes"):
        MediaKey(join="last", indexes="pixel_values")
    with pytest.raises(TypeError, match="MediaKey"):
        BatchLayout(media={"pixel_values": "last"})
    with pytest.raises(TypeError, match="first_position"):
        BatchLayout(first_position=-1)
    with pytest.raises(TypeError, match="one_shape"):
        MediaKey(one_shape=True)  # type: ignore[arg-type]
    assert "pixel_values" in BatchLayout(media={"pixel_values": MediaKey(per_row=True)}).packing_refusal
