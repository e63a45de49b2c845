"""The mutations the fuzzer makes: each changes one case the way a trainer's data goes wrong
(never a tensor in place) and returns its name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

_HUGE = (2**26, 2**31, 2**62 + 1, 2**63 - 1, (2**63 - 1) // 2, -(2**31))
_GRID_VALUES = (0, -1, 1, 2, 3, 7, 16, *_HUGE)
# whole rows that once crashed, stalled or wrapped around: each is tried on every grid key of every case
CORRUPT_ROWS = ((2**63 - 1, 2, 2), ((2**63 - 1) // 2, 4, 2), (1 + 2**62, 4, 4), (2**26, 2, 2), (2**31, 2, 2),
                (1, 2**31, 2**31), (2**21, 2**21, 2**21))
_GRID_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.int8, torch.int16, torch.int32, torch.uint8,
                torch.bool)
_SECONDS = (float("nan"), float("inf"), -1.0, 0.0, 0.5, 1e30, 2.0**40, 1e18)
_ID_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)
REFUSED = "refused: "  # names of mutations that leave an input no engine can read


#: the collators' calls, and every call that takes per-sample processor outputs (``Case.outputs``)
COLLATOR_CALLS = ("PaddedCollator", "PackedCollator")
SAMPLE_CALLS = ("batch", *COLLATOR_CALLS)


@dataclasses.dataclass
class Case:
    """A batch to mutate: the example it comes from, the call it goes to and its arguments."""

    case: str  # the example case's name
    call: str  # "position_ids", "rope_index" or one of SAMPLE_CALLS
    ids: Any
    mask: Any
    inputs: dict[str, Any]
    options: dict[str, Any]  # mm_processor_kwargs, for position_ids
    outputs: list[Any] = dataclasses.field(default_factory=list)  # per-sample processor outputs, for SAMPLE_CALLS
    packing: dict[str, Any] = dataclasses.field(default_factory=dict)  # cu_seqlens or segment_ids
    packed: Any = None  # the layout (a _packed.Packed) while the case is as it was laid out
    convention: str = "transformers"  # the engine's position convention
    #: the engine's declared media keys (``engine.batch_layout.media``): which keys the grid,
    #: seconds and audio mutations change, by the role the plugin gives them, never by their names
    media: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def declared(case: Case, role: str) -> list[str]:
    """The keys the case's inputs hold that its engine declares with ``role``, sorted."""
    inputs = case.inputs if isinstance(case.inputs, dict) else {}
    return sorted(key for key in inputs if getattr(case.media.get(key), "role", None) == role)


def one_of(choices: Any, options: list[Any]) -> Any:
    """A choice among ``options``; none to choose from is a ``ValueError`` (the mutation does not apply)."""
    if not options:
        raise ValueError("nothing to choose from")
    return choices.choice(options)


def applicable(case: Case) -> list[Callable[[Case, Any], str]]:
    """The mutations that apply to what the case holds now (earlier mutations may have changed it)."""
    if case.call in SAMPLE_CALLS:
        return [_batch_mask_shape, _batch_mask_length, _batch_ids_dtype, _batch_drop_media, _batch_meta,
                _batch_rows_flat, _sample_key_not_a_string, _sample_extra_column, _sample_labels, _sample_not_a_dict,
                _samples_reversed, _sample_twice, _sample_media_numpy, _sample_empty, _sample_own_padding,
                _sample_token_types]
    found: list[Callable[[Case, Any], str]] = [_ids_dtype, _ids_token, _ids_truncated, _ids_meta, _mask_values,
                                                _mask_shape, _inputs_not_a_dict, _unknown_key, _keys_reversed]
    if grid_keys(case):
        found += [_grid_value, _grid_value, _grid_dtype, _grid_shape, _grid_container, _grid_meta, _grid_dropped]
    if declared(case, "seconds"):
        found += [_seconds_value, _seconds_form]
    if declared(case, "stamps"):
        found += [_stamps_value, _stamps_form]
    if declared(case, "audio_mask"):
        found += [_audio_mask]
    if declared(case, "audio_lengths"):
        found += [_audio_lengths]
    return found


def is_grid(value: Any) -> bool:
    """A grid the grid mutations can change: an ``(N, 3)`` tensor with values."""
    return (isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[0] > 0 and value.shape[1] == 3
            and value.device.type != "meta")


def grid_keys(case: Case) -> list[str]:
    """The keys declared ``role="grid"`` whose values the grid mutations can change, sorted."""
    return [key for key in declared(case, "grid") if is_grid(case.inputs[key])]


def _grid_key(case: Case, choices: Any) -> str:
    return one_of(choices, grid_keys(case))


def _grid_value(case: Case, choices: Any) -> str:
    key = _grid_key(case, choices)
    grid = case.inputs[key].clone()
    row, column, value = choices.integer(0, grid.shape[0] - 1), choices.integer(0, 2), choices.choice(_GRID_VALUES)
    grid[row, column] = value
    case.inputs[key] = grid
    return f"{key}[{row}, {column}] = {value}"


def _grid_dtype(case: Case, choices: Any) -> str:
    key, dtype = _grid_key(case, choices), choices.choice(_GRID_DTYPES)
    grid = case.inputs[key]
    case.inputs[key] = grid.to(dtype) + (0.5 if dtype.is_floating_point and choices.integer(0, 1) else 0)
    return f"{key} as {dtype}"


def _grid_shape(case: Case, choices: Any) -> str:
    key = _grid_key(case, choices)
    grid = case.inputs[key]
    shaped = choices.choice((grid[:, :2], grid.reshape(-1), grid.unsqueeze(0), grid[:0], torch.cat((grid, grid))))
    case.inputs[key] = shaped
    return f"{key} of shape {tuple(shaped.shape)}"


def _grid_container(case: Case, choices: Any) -> str:
    key = _grid_key(case, choices)
    form = choices.choice(("list", "numpy"))
    case.inputs[key] = case.inputs[key].tolist() if form == "list" else case.inputs[key].numpy().copy()
    return f"{key} as a {form}"


def _grid_meta(case: Case, choices: Any) -> str:
    key = _grid_key(case, choices)
    case.inputs[key] = case.inputs[key].to("meta")
    return f"{REFUSED}{key} on meta"


def _grid_dropped(case: Case, choices: Any) -> str:
    key = _grid_key(case, choices)
    del case.inputs[key]
    return f"no {key}"


def _seconds_key(case: Case, choices: Any) -> str:
    return one_of(choices, declared(case, "seconds"))


def _seconds_value(case: Case, choices: Any) -> str:
    key, value = _seconds_key(case, choices), choices.choice(_SECONDS)
    seconds = torch.as_tensor(case.inputs[key], dtype=torch.float64 if value > 2.0**100 else None).clone()
    if seconds.numel() == 0 or not seconds.dtype.is_floating_point:
        seconds = seconds.to(torch.float32)
    if seconds.numel():
        seconds.view(-1)[choices.integer(0, seconds.numel() - 1)] = value
    case.inputs[key] = seconds
    return f"{key} holds {value}"


def _seconds_form(case: Case, choices: Any) -> str:
    key = _seconds_key(case, choices)
    seconds = torch.as_tensor(case.inputs[key])
    form = choices.choice(("str", "list", "one more", "complex", "int", "meta"))
    case.inputs[key] = {"str": "2", "list": seconds.tolist(), "one more": torch.cat((seconds.reshape(-1),
                        seconds.reshape(-1)[:1] + 1)), "complex": seconds.to(torch.complex64),
                        "int": seconds.long(), "meta": seconds.to("meta")}[form]
    return f"{key} as {form}"


def _stamps_value(case: Case, choices: Any) -> str:
    """A frame's time stamp out of range, or before the one before it."""
    key = one_of(choices, declared(case, "stamps"))
    stamps = torch.as_tensor(case.inputs[key]).to(torch.float64).reshape(-1).clone()
    if stamps.numel() == 0:
        raise ValueError("no stamp to change")
    frame = choices.integer(0, stamps.numel() - 1)
    value = choices.choice((*_SECONDS, "earlier"))
    if value == "earlier":  # within a grid, or at one's first frame: placed or refused as the reference is
        stamps[frame] = stamps[frame - 1] - 0.5 if frame else -0.5
    else:
        stamps[frame] = value
    case.inputs[key] = stamps if value != "earlier" and abs(value) >= 2.0**100 else stamps.to(torch.float32)
    return f"{key}[{frame}] holds {value}"


def _stamps_form(case: Case, choices: Any) -> str:
    key = one_of(choices, declared(case, "stamps"))
    stamps = torch.as_tensor(case.inputs[key])
    form = choices.choice(("str", "list", "one more", "one fewer", "complex", "bool", "2-D", "meta"))
    case.inputs[key] = {"str": "0.5", "list": stamps.tolist(), "one more": torch.cat((stamps.reshape(-1),
                        stamps.reshape(-1)[-1:] + 1)), "one fewer": stamps.reshape(-1)[:-1],
                        "complex": stamps.to(torch.complex64), "bool": stamps > 0, "2-D": stamps.reshape(1, -1),
                        "meta": stamps.to("meta")}[form]
    return f"{key} as {form}"


def _one_key(case: Case, choices: Any, role: str) -> str:
    """The case's key of ``role``: a choice only where it holds more than one (no draw spent on one)."""
    keys = declared(case, role)
    return keys[0] if len(keys) == 1 else one_of(choices, keys)


def _audio_mask(case: Case, choices: Any) -> str:
    key = _one_key(case, choices, "audio_mask")
    mask = case.inputs[key]
    form = choices.choice(("list", "numpy", "1-D", "float", "empty row", "meta", "negative"))
    changed: Any
    if form == "list":
        changed = mask.tolist()
    elif form == "numpy":
        changed = mask.numpy().copy()
    elif form == "1-D":
        changed = mask[0]
    elif form == "float":
        changed = mask.float()
    elif form == "meta":
        changed = mask.to("meta")
    else:
        changed = mask.clone()
        changed[choices.integer(0, mask.shape[0] - 1)] = 0 if form == "empty row" else -(2**40)
    case.inputs[key] = changed
    return f"{key} {form}"


def _audio_lengths(case: Case, choices: Any) -> str:
    key = _one_key(case, choices, "audio_lengths")
    lengths = torch.as_tensor(case.inputs[key]).clone()
    form = choices.choice(("negative", "huge", "float", "list", "list of floats", "uint64"))
    if form in ("negative", "huge") and lengths.numel():
        lengths.view(-1)[0] = -1 if form == "negative" else choices.choice(_HUGE)
    changed = {"float": lengths.float(), "list": lengths.tolist(), "list of floats": (lengths.double() + 0.5).tolist(),
               "uint64": lengths.clamp(min=0).to(torch.uint64)}
    case.inputs[key] = changed.get(form, lengths)
    return f"{key} {form}"


def _ids_dtype(case: Case, choices: Any) -> str:
    dtype = choices.choice(_ID_DTYPES)
    case.ids = case.ids.to(dtype)
    return f"input_ids as {dtype}"


def _ids_token(case: Case, choices: Any) -> str:
    """A token of the batch's own put anywhere: a sampled placeholder or marker, or one removed."""
    ids = case.ids.clone()
    row, column = choices.integer(0, ids.shape[0] - 1), choices.integer(0, ids.shape[1] - 1)
    source = (choices.integer(0, ids.shape[0] - 1), choices.integer(0, ids.shape[1] - 1))
    ids[row, column] = ids[source]
    case.ids = ids
    return f"input_ids[{row}, {column}] = input_ids{source}"


def _ids_truncated(case: Case, choices: Any) -> str:
    length = choices.integer(1, case.ids.shape[1])
    case.ids = case.ids[:, :length]
    if isinstance(case.mask, torch.Tensor) and case.mask.dim() == 2:
        case.mask = case.mask[:, :length]
    return f"truncated to {length} tokens"


def _ids_meta(case: Case, choices: Any) -> str:
    case.ids = case.ids.to("meta")
    return f"{REFUSED}input_ids on meta"


def _mask_values(case: Case, choices: Any) -> str:
    mask = torch.ones_like(case.ids, dtype=torch.long) if case.mask is None else case.mask.clone()
    value = choices.choice((0, 2, -1))
    mask[choices.integer(0, mask.shape[0] - 1), choices.integer(0, mask.shape[1] - 1)] = value
    case.mask = mask
    return f"a mask value {value}"


def _mask_shape(case: Case, choices: Any) -> str:
    mask = torch.ones_like(case.ids) if case.mask is None else case.mask
    form = choices.choice(("1-D", "shorter", "float", "none", "meta"))
    case.mask = {"1-D": mask.reshape(-1), "shorter": mask[..., :-1], "float": mask.float(), "none": None,
                 "meta": mask.to("meta")}[form]
    return f"mask {form}"


def _inputs_not_a_dict(case: Case, choices: Any) -> str:
    if case.call == "rope_index":
        return _unknown_key(case, choices)
    case.inputs = choices.choice(("abc", [1, 2], 3, torch.ones(2)))
    return f"{REFUSED}multi_modal_inputs a {type(case.inputs).__name__}"


def _keys_reversed(case: Case, choices: Any) -> str:
    if isinstance(case.inputs, dict):  # a reading must not depend on which key comes first
        case.inputs = dict(reversed(case.inputs.items()))
    return "keys in reverse order"


def _unknown_key(case: Case, choices: Any) -> str:
    if isinstance(case.inputs, dict):
        case.inputs["image_grid_thw_typo"] = torch.ones(1, 3, dtype=torch.long)
    return "an unknown key"


def _batch_mask_shape(case: Case, choices: Any) -> str:
    index = choices.integer(0, len(case.outputs) - 1)
    mask = case.outputs[index]["attention_mask"]
    form = choices.choice(("1-D", "two rows", "1-D with padding"))
    if form == "1-D":
        changed = mask[0]
    elif form == "two rows":
        changed = torch.cat((mask, mask))
    else:
        changed = mask[0].clone()
        changed[-1] = 0
    case.outputs[index]["attention_mask"] = changed
    return f"sample {index}: attention_mask {form}"


def _batch_mask_length(case: Case, choices: Any) -> str:
    index = choices.integer(0, len(case.outputs) - 1)
    if case.outputs[index]["attention_mask"].shape[-1] == 0:
        raise ValueError("no mask value to drop")
    case.outputs[index]["attention_mask"] = case.outputs[index]["attention_mask"][..., :-1]
    return f"{REFUSED}sample {index}: a shorter attention_mask"


def _batch_ids_dtype(case: Case, choices: Any) -> str:
    index = choices.integer(0, len(case.outputs) - 1)
    form = choices.choice(("list", "1-D", "int32", "uint8", "float"))
    ids = case.outputs[index]["input_ids"]
    case.outputs[index]["input_ids"] = {"list": ids.tolist(), "1-D": ids[0], "int32": ids.int(),
                                        "uint8": ids.clamp(max=255).to(torch.uint8), "float": ids.float()}[form]
    return f"sample {index}: input_ids {form}"


def _batch_rows_flat(case: Case, choices: Any) -> str:
    """One sample's per-token tensors as ``(L,)`` rows, as a dataset's rows often hold them."""
    index = choices.integer(0, len(case.outputs) - 1)
    output = case.outputs[index]
    length = output["input_ids"].shape[-1]
    for key, value in list(output.items()):
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == (1, length):
            output[key] = value[0]
    return f"sample {index}: (L,) rows"


def _batch_drop_media(case: Case, choices: Any) -> str:
    index = choices.integer(0, len(case.outputs) - 1)
    keys = sorted(key for key in case.outputs[index] if key not in ("input_ids", "attention_mask"))
    if not keys:
        return "nothing to drop"
    key = choices.choice(keys)
    case.outputs[index][key] = None
    return f"sample {index}: {key} None"


def _batch_meta(case: Case, choices: Any) -> str:
    index = choices.integer(0, len(case.outputs) - 1)
    case.outputs[index]["input_ids"] = case.outputs[index]["input_ids"].to("meta")
    return f"{REFUSED}sample {index}: input_ids on meta"


# -- samples as a dataset may hand them to a collator ----------------------------------------------


def _sample(case: Case, choices: Any) -> tuple[int, dict[str, Any]]:
    """A sample that is still a dict, as a copy the mutation may change."""
    index = one_of(choices, [index for index, output in enumerate(case.outputs) if isinstance(output, dict)])
    case.outputs[index] = dict(case.outputs[index])
    return index, case.outputs[index]


def _sample_key_not_a_string(case: Case, choices: Any) -> str:
    index, output = _sample(case, choices)
    key = choices.choice((0, 1.5, ("image_grid_thw",), b"pixel_values"))
    output[key] = torch.ones(1, 3, dtype=torch.long)
    return f"{REFUSED}sample {index}: the key {key!r}"


def _sample_extra_column(case: Case, choices: Any) -> str:
    """A column of the dataset that is no processor output."""
    index, output = _sample(case, choices)
    name, value = choices.choice((("id", "row-17"), ("length", 17), ("messages", [{"role": "user"}]),
                                  ("score", torch.tensor(0.5))))
    output[name] = value
    return f"sample {index}: a column {name!r} of {type(value).__name__}"


def _sample_labels(case: Case, choices: Any) -> str:
    index, output = _sample(case, choices)
    ids = output["input_ids"]
    if choices.integer(0, 1):
        labels = ids.clone()
        labels[..., : ids.shape[-1] // 2] = -100
        output["labels"] = labels
        return f"sample {index}: labels with the prompt masked"
    output["labels"] = ids[..., :-1]
    refused = REFUSED if case.call in COLLATOR_CALLS else ""  # to engine.batch, labels are one more input
    return f"{refused}sample {index}: labels one shorter than input_ids"


def _sample_not_a_dict(case: Case, choices: Any) -> str:
    index = choices.integer(0, len(case.outputs) - 1)
    case.outputs[index] = choices.choice(("a text", [1, 2, 3], torch.ones(3, dtype=torch.long)))
    return f"{REFUSED}sample {index} a {type(case.outputs[index]).__name__}"


def _samples_reversed(case: Case, choices: Any) -> str:
    case.outputs = case.outputs[::-1]
    return "samples in reverse order"


def _sample_twice(case: Case, choices: Any) -> str:
    index = choices.integer(0, len(case.outputs) - 1)
    case.outputs.insert(index, case.outputs[index])
    return f"sample {index} twice"


def _sample_media_numpy(case: Case, choices: Any) -> str:
    index, output = _sample(case, choices)
    key = one_of(choices, sorted(key for key, value in output.items() if isinstance(key, str)
                                 and key not in ("input_ids", "attention_mask") and isinstance(value, torch.Tensor)))
    output[key] = output[key].numpy().copy()
    return f"{REFUSED}sample {index}: {key} as a numpy array"


def _sample_empty(case: Case, choices: Any) -> str:
    index, output = _sample(case, choices)
    ids, mask = output.get("input_ids"), output.get("attention_mask")
    if isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor) and mask.shape[-1] != ids.shape[-1]:
        raise ValueError("emptying both would hide the mask's other length")
    for key in ("input_ids", "attention_mask"):
        if isinstance(output.get(key), torch.Tensor):
            output[key] = output[key][..., :0]
    refused = REFUSED if case.call in COLLATOR_CALLS else ""  # engine.batch pads it as a row of padding
    return f"{refused}sample {index}: no tokens"


def _sample_own_padding(case: Case, choices: Any) -> str:
    """A sample padded on its own (a processor call with ``padding="max_length"``)."""
    index, output = _sample(case, choices)
    mask = output["attention_mask"].clone()
    mask[..., -1] = 0
    output["attention_mask"] = mask
    return f"sample {index}: its last token padding"


def _sample_token_types(case: Case, choices: Any) -> str:
    index, output = _sample(case, choices)
    key = one_of(choices, sorted(key for key in output if isinstance(key, str) and key.endswith("token_type_ids")))
    output[key] = output[key][..., :-1]
    return f"sample {index}: {key} one shorter"
