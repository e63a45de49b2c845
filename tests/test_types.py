"""What hooks return checks itself when built, so a plugin's mistake is caught where it is made."""

import pytest
import torch

from mmrope_core import RopeBinding
from mmrope_core.kernel import RopeKernel
from mmrope_core.mrope import MropeFamily, TemporalRule


class Zeros(RopeKernel):
    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        return torch.zeros(3, *input_ids.shape, dtype=torch.long), torch.zeros(input_ids.shape[0], 1, dtype=torch.long)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "2d"}, "kind must be 'mrope' or '1d'"),
    ({"kind": "mrope"}, "needs a RopeKernel, got NoneType"),
    ({"kind": "mrope", "kernel": Zeros().rope_index}, "needs a RopeKernel, got method"),
    ({"kind": "1d", "kernel": Zeros()}, "must not carry a kernel"),
    ({"kind": "mrope", "kernel": Zeros(), "implementation": ""}, "implementation must be a non-empty string"),
    ({"kind": "mrope", "kernel": Zeros(), "description": None}, "description must be a string"),
])
def test_a_malformed_binding_is_refused_where_it_is_built(kwargs, message):
    with pytest.raises(TypeError, match=message):
        RopeBinding(**kwargs)


def test_a_kernel_needs_its_rope_index():
    class Nothing(RopeKernel):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Nothing()


def test_the_default_four_rows_are_the_text_row_over_the_rope_index():
    kernel = Zeros()
    assert kernel.position_dtype == torch.int64 and not kernel.places_packed_rows
    mask = torch.tensor([[False, True, True]])
    four = kernel.position_ids(torch.ones(1, 3, dtype=torch.long), mask)
    assert four.tolist() == [[[1, 0, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0]]]


@pytest.mark.parametrize("kwargs, message", [
    ({"name": ""}, "name must be a non-empty string"),
    ({"spatial_merge_size": 0}, "spatial_merge_size must be a positive int"),
    ({"temporal": "rounded"}, "temporal must be a truncating TemporalRule or None"),
    ({"video_markers": (1,)}, "video_markers must be a"),
    ({"image_token_id": -1}, "token ids must be non-negative ints"),
    ({"image_key": ""}, "'My-VL' needs image_key, the input key of its media"),
    ({"video_token_id": 6}, "'My-VL' needs video_key"),
    ({"video_token_id": 6, "video_key": "videos", "temporal": TemporalRule(2)}, "'My-VL' needs seconds_key"),
])
def test_a_malformed_family_is_refused_where_it_is_built(kwargs, message):
    with pytest.raises(TypeError, match=message):
        MropeFamily(**{"name": "My-VL", "spatial_merge_size": 2, "image_token_id": 5, "image_key": "images", **kwargs})
