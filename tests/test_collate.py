"""Batching per-sample multimodal inputs."""

import pytest
import torch

from mmrope_core import CollateError
from mmrope_core.collate import collate


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


def test_collate_takes_a_list_of_dicts():
    with pytest.raises(CollateError, match="list of per-sample dicts"):
        collate({"pixel_values": torch.ones(1)})
    with pytest.raises(CollateError, match="sample 1 is an int"):
        collate([{}, 3])


def test_varlen_tensors_are_padded_in_every_dimension_but_the_batch_one():
    short = {"input_features": torch.ones(1, 3, 4), "input_features_mask": torch.ones(1, 3, dtype=torch.bool)}
    long = {"input_features": torch.ones(2, 5, 4), "input_features_mask": torch.ones(2, 5, dtype=torch.bool)}
    batch = collate([short, long], varlen_keys={"input_features", "input_features_mask"})
    assert batch["input_features"].shape == (3, 5, 4)
    assert batch["input_features"][0, 3:].eq(0).all() and batch["input_features"][0, :3].eq(1).all()
    assert batch["input_features_mask"].tolist()[0] == [True, True, True, False, False]


@pytest.mark.parametrize("side", ["left", "right"])
def test_token_types_are_padded_on_the_side_of_the_tokens(side):
    from mmrope_core.collate import batch_processor_outputs

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
