"""Whether a model keeps the segments of a packed row apart, measured: a tiny random model built
from a shrunk copy of its config runs a packed row of text segments (each with a prefix of
token type 0 and a suffix of type 1, where the model takes token types) and each segment alone.

Where a config's settings and the model's code alone cannot tell (a text config asking for
bidirectional attention, which the multimodal model above it may replace with a mask of its own;
a mask overlay that transformers cuts at the boundaries or reads by position; chunks counted
from the row's first token or from each segment's), this is what the installed transformers'
model does. One measurement per config (class and values) and settings, kept for the process,
about a second; a model that cannot be built or run this way is not measured (None), and the
caller refuses it.
"""

from __future__ import annotations

import inspect
from typing import Any

#: Sizes of the tiny copy, wherever a config or one of its sub-configs holds the key.
_SIZES = {
    **dict.fromkeys(("hidden_size", "projection_dim", "text_hidden_size", "vision_output_dim"), 64),
    **dict.fromkeys(("intermediate_size", "moe_intermediate_size"), 64),
    **dict.fromkeys(("num_attention_heads", "num_heads"), 2),
    "num_key_value_heads": 1,
    "head_dim": 32,
    "hidden_size_per_layer_input": 16,
    **dict.fromkeys(("num_hidden_layers", "depth"), 2),
    **dict.fromkeys(("num_experts", "num_local_experts"), 2),
    "num_experts_per_tok": 1,
}
#: The segments measured: (prefix, suffix) tokens of each.
_SEGMENTS = ((3, 4), (5, 2), (2, 6))
#: How far a segment may differ from its sample alone (float32 sums in another order).
_TOLERANCE = 1e-4


def packed_segments_differ(config: Any, **settings: int) -> float | None:
    """The largest difference between a packed text segment's hidden states and its sample's
    alone, on a tiny random model of ``config``'s base model class, with ``settings`` set wherever
    the config or a sub-config holds them (``attention_chunk_size=4``: chunks shorter than the
    measured rows); None where it cannot be measured (no model class, a config that does not
    shrink, a forward that fails)."""
    try:
        key = (type(config).__module__, type(config).__qualname__, config.to_json_string(use_diff=False),
               tuple(sorted(settings.items())))
    except (AttributeError, TypeError, ValueError):
        return None
    if key not in _MEASURED:
        _MEASURED[key] = _measured(config, settings)
    return _MEASURED[key]


def keeps_segments_apart(difference: float | None) -> bool:
    return difference is not None and difference <= _TOLERANCE


_MEASURED: dict[tuple[Any, ...], float | None] = {}


def _measured(config: Any, settings: dict[str, int]) -> float | None:
    import torch

    try:
        model = _tiny_model(config, settings)
        lengths = [prefix + suffix for prefix, suffix in _SEGMENTS]
        allowed = _plain_token_ids(model.config.to_dict())
        generator = torch.Generator().manual_seed(0)
        rows = [allowed[torch.randint(len(allowed), (1, length), generator=generator)] for length in lengths]
        types = [torch.tensor([[0] * prefix + [1] * suffix]) for prefix, suffix in _SEGMENTS]
        takes = inspect.signature(model.forward).parameters
        type_key = next((name for name in ("token_type_ids", "mm_token_type_ids") if name in takes), None)

        def run(ids: Any, token_types: Any, positions: Any = None) -> Any:
            extra = {} if type_key is None else {type_key: token_types}
            if positions is not None:
                extra["position_ids"] = positions
            return model(input_ids=ids, use_cache=False, **extra).last_hidden_state[0]

        with torch.no_grad(), torch.random.fork_rng():
            alone = [run(ids, token_types) for ids, token_types in zip(rows, types)]
            positions = torch.cat([torch.arange(length) for length in lengths])[None]
            packed = run(torch.cat(rows, dim=1), torch.cat(types, dim=1), positions)
        return max(float((mine - own).abs().max()) for mine, own in zip(packed.split(lengths), alone))
    except Exception:  # a config or model this does not fit: not measured, and so refused
        return None


def _plain_token_ids(values: dict[str, Any]) -> Any:
    """Ids below every vocabulary of the config (at most 64) that name no special token (an image
    placeholder would ask for pixels): the measured rows' tokens."""
    import torch

    vocabularies, special = [64], set()
    pending = [values]
    while pending:
        current = pending.pop()
        for key, value in current.items():
            if isinstance(value, dict):
                pending.append(value)
            elif isinstance(value, int) and not isinstance(value, bool):
                if key.startswith("vocab_size"):
                    vocabularies.append(value)
                elif key.endswith(("_id", "_index")):
                    special.add(value)
            elif isinstance(value, list) and key.endswith(("_ids", "_id")):
                special.update(item for item in value if isinstance(item, int))
    allowed = [token for token in range(1, min(vocabularies)) if token not in special]
    if len(allowed) < 4:
        raise ValueError("too few plain token ids to measure with")
    return torch.tensor(allowed)


def _tiny_model(config: Any, settings: dict[str, int]) -> Any:
    import torch
    from transformers import AutoModel

    values = config.to_dict()
    _shrink(values, settings)
    tiny = type(config).from_dict(values)
    tiny._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        try:
            model = AutoModel.from_config(tiny, attn_implementation="sdpa")
        except ValueError:  # a type mapped to a head only (ShieldGemma 2 on Gemma3's): its base model
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_config(tiny, attn_implementation="sdpa").model
    return model.eval().float()


def _shrink(values: dict[str, Any], settings: dict[str, int]) -> None:
    """Tiny sizes in ``values`` (a config's ``to_dict()``) and its sub-configs, per-layer lists
    cut to the layers kept, and ``settings`` set where they are held."""
    count = values.get("num_hidden_layers")
    for key, size in {**_SIZES, **settings}.items():
        if isinstance(values.get(key), int) and not isinstance(values.get(key), bool):
            values[key] = size
    if isinstance(count, int) and count > values.get("num_hidden_layers", count):
        for key, value in list(values.items()):
            if isinstance(value, list) and len(value) == count:
                values[key] = value[: values["num_hidden_layers"]]
    layers = values.get("per_layer_config")
    if isinstance(layers, dict) and isinstance(values.get("num_hidden_layers"), int):
        values["per_layer_config"] = {index: layer for index, layer in layers.items()
                                      if int(index) < values["num_hidden_layers"]}
    for key, value in list(values.items()):  # ids above them are never fed: the measured rows hold ids below 64
        if key.startswith("vocab_size") and isinstance(value, int) and not isinstance(value, bool):
            values[key] = min(value, 1024)
    for value in values.values():
        if isinstance(value, dict) and ("model_type" in value or "hidden_size" in value):
            _shrink(value, settings)
