"""The public kernel API for plugin authors: the token types it accepts."""

import pytest
import torch

from mmrope_core import InvalidInputError
from mmrope_core.mrope import MediaGrids, MediaKind, check_placeholders, mrope_positions

GRIDS = {1: MediaGrids(torch.tensor([[1, 4, 4]]))}


def kinds(type_id):
    return (MediaKind(type_id, "image", "<image>", "image_grid_thw"),)


@pytest.mark.parametrize("bad, dtype", [(-1, torch.int64), (128, torch.int64), (255, torch.int16),
                                        (-128, torch.int8), (-1, torch.int8), (300, torch.int32)])
@pytest.mark.parametrize("check", [mrope_positions, check_placeholders])
def test_token_types_outside_0_to_127_are_refused(bad, dtype, check):
    types = torch.zeros(2, 12, dtype=dtype)
    types[1, 3:7] = bad
    mask = torch.ones(2, 12, dtype=torch.bool)
    with pytest.raises(InvalidInputError, match=f"0 for text and 1 to 127 .* found {bad}"):
        check(types, mask, kinds(1), GRIDS, spatial_merge_size=2)


@pytest.mark.parametrize("mask", [None, torch.tensor([[False, True, True, True, True, True, True, True, True]])])
def test_media_type_127_is_placed_like_any_other(mask):
    types = torch.zeros(1, 9, dtype=torch.int8)
    types[0, 3:7] = 1
    as_one = mrope_positions(types, mask, kinds(1), GRIDS, spatial_merge_size=2)
    as_127 = mrope_positions(types * 127, mask, kinds(127), {127: GRIDS[1]}, spatial_merge_size=2)
    assert torch.equal(as_one[0], as_127[0]) and torch.equal(as_one[1], as_127[1])
