"""What hooks return checks itself when built, so a plugin's mistake is caught where it is made."""

import pytest
import torch

from mmrope_core import RopeBinding


def rope_index(input_ids, attention_mask=None, **kwargs):
    return torch.zeros(3, *input_ids.shape, dtype=torch.long), torch.zeros(input_ids.shape[0], 1, dtype=torch.long)


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "2d"}, "kind must be 'mrope' or '1d'"),
    ({"kind": "mrope"}, "needs a callable rope_index"),
    ({"kind": "1d", "rope_index": rope_index}, "must not carry a rope_index"),
    ({"kind": "1d", "position_ids": rope_index}, "position_ids must be a callable, and only for kind='mrope'"),
    ({"kind": "mrope", "rope_index": rope_index, "position_ids": "not callable"}, "position_ids must be a callable"),
    ({"kind": "1d", "packed_rope_index": rope_index}, "packed_rope_index must be a callable, and only for kind='mrope'"),
    ({"kind": "mrope", "rope_index": rope_index, "packed_rope_index": 3}, "packed_rope_index must be a callable"),
    ({"kind": "mrope", "rope_index": rope_index, "packed_rope_index": rope_index, "packed_position_ids": 3},
     "packed_position_ids must be a callable"),
    ({"kind": "mrope", "rope_index": rope_index, "packed_position_ids": rope_index},
     "packed_position_ids needs packed_rope_index"),
    ({"kind": "mrope", "rope_index": rope_index, "token_types": 3}, "token_types must be callable"),
    ({"kind": "mrope", "rope_index": rope_index, "packed_rope_index": rope_index, "token_types": rope_index,
      "packed_token_types": 3}, "packed_token_types must be a callable"),
    ({"kind": "mrope", "rope_index": rope_index, "token_types": rope_index, "packed_token_types": rope_index},
     "packed_token_types needs packed_rope_index and token_types"),
    ({"kind": "mrope", "rope_index": rope_index, "packed_rope_index": rope_index, "packed_token_types": rope_index},
     "packed_token_types needs packed_rope_index and token_types"),
    ({"kind": "mrope", "rope_index": rope_index, "implementation": ""}, "implementation must be a non-empty string"),
])
def test_a_malformed_binding_is_refused_where_it_is_built(kwargs, message):
    with pytest.raises(TypeError, match=message):
        RopeBinding(**kwargs)


def test_a_binding_defaults_to_int64_positions_and_no_position_ids():
    binding = RopeBinding("mrope", rope_index)
    assert binding.position_dtype == torch.int64 and binding.position_ids is None
