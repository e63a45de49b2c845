"""The core's reading of media arrays, on what the engine-level tests do not reach."""

import pytest
import torch

from mmrope_core.errors import InvalidInputError, PlaceholderMismatchError
from mmrope_core.media import read_audio_lengths, read_grid, read_media, read_seconds


def test_seconds_are_counted_against_the_read_grid_whatever_the_key_order():
    from mmrope_qwen_vl.families import TIMED_MEDIA_KEYS as keys  # (Qwen2.5-VL's, as its plugin declares them)

    with pytest.raises(InvalidInputError, match=r"video_grid_thw must be a tensor of shape \(N, 3\), got int"):
        read_media({"second_per_grid_ts": [2.0], "video_grid_thw": 5}, keys)
    with pytest.raises(InvalidInputError, match="second_per_grid_ts has 1 value for 2 videos in video_grid_thw"):
        read_media({"second_per_grid_ts": [2.0], "video_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 2]])}, keys)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32, torch.uint64])
def test_grids_of_any_integer_dtype_read_as_int64_with_their_values(dtype):
    grid = torch.tensor([[2, 4, 6]], dtype=dtype)
    assert torch.equal(read_grid("image_grid_thw", grid, tokens=12), torch.tensor([[2, 4, 6]]))


def test_products_of_narrow_grids_do_not_wrap():
    # 200 * 200 * 200 wraps in uint8; the grid needs 2,000,000 patches, far more than 10 tokens hold
    with pytest.raises(PlaceholderMismatchError, match=r"row 0 is \(200, 200, 200\)"):
        read_grid("image_grid_thw", torch.tensor([[200, 200, 200]], dtype=torch.uint8), tokens=300)


@pytest.mark.parametrize("value, message", [
    ([1e300], r"holds 1e\+300 seconds per grid"),
    ([True], "must hold seconds per video grid"),
    (["2"], "must hold seconds per video grid"),
    ([[1.0], [2.0, 3.0]], "must hold seconds per video grid"),
])
def test_seconds_lists_are_checked_before_float32_could_change_them(value, message):
    with pytest.raises(InvalidInputError, match=message):
        read_seconds("second_per_grid_ts", value)


def test_seconds_lists_become_float32_as_processors_return_them():
    assert torch.equal(read_seconds("second_per_grid_ts", [0.5, 2]), torch.tensor([0.5, 2.0]))


@pytest.mark.parametrize("value, message", [
    ([1.5], "must hold integer feature lengths"),
    (["16"], "must hold integer feature lengths"),
    ([True], "must hold integer feature lengths"),
    (torch.tensor([2**64 - 1], dtype=torch.uint64), "negative or impossible length"),
    (torch.tensor([-3]), "negative or impossible length"),
])
def test_audio_lengths_are_integers_that_can_be(value, message):
    with pytest.raises(InvalidInputError, match=message):
        read_audio_lengths("audio_seqlens", value)


def test_audio_lengths_beyond_the_batch_are_a_mismatch():
    with pytest.raises(PlaceholderMismatchError, match="more than the batch's 10 tokens can stand for"):
        read_audio_lengths("audio_seqlens", [100, 2**40], tokens=10)
    assert torch.equal(read_audio_lengths("audio_seqlens", [100, 3000], tokens=10), torch.tensor([100, 3000]))
