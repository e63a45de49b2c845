"""What a model does with a packed row, seen on a tiny random model built from its config
(:mod:`mmrope_core.shrunk`): its layers, read off the built modules, and a packed row of text
segments (each with a prefix of token type 0 and a suffix of type 1, where the model takes token
types) measured against each segment alone.

Where a packed segment differs from its sample alone, more runs tell why: the same row with
every token of type 0 (a mask overlay over token types), and the row given the segments'
boundaries as the packing collator gives them (``cu_seq_lens_q``, ``seq_idx``: the kernels of
layers carrying state read them; on a CUDA device where there is one). One build and measurement
per config (class and values) and settings, kept for the process, about a second; a model that
cannot be built or run is not measured, and :attr:`Behaviour.failure` says why.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

from .shrunk import WIDTH, fit_rope_sections, model_class, tiny_config

#: The segments measured: (prefix, suffix) tokens of each, each at most ``index_topk`` (8) tokens.
_SEGMENTS = ((3, 4), (5, 2), (2, 6))
#: How far a segment may differ from its sample alone (float32 sums in another order).
_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class Layers:
    """What the language-model layers built from a config are, read off their modules.

    Attributes:
        model_class: the class built.
        attention: whether any layer holds an attention module.
        bidirectional: whether some self-attention module attends both ways.
        encoder: whether the layers attend to an encoder's output (an encoder-decoder model).
        cross_attention: whether the layers attend to media through cross-attention modules.
        state: the kinds of the layers that carry state along the row (a causal convolution, a
            recurrent or state-space mixer): their ``layer_types`` entry, else their class.
        kernels: the kernel packages whose varlen kernels take the boundaries for those layers.
        indexed: the kinds of the layers that pick each query's keys with an indexer.
        media_by_rows: the ``forward`` arguments counting media per sample that it hands to the
            batch's rows one by one.
    """

    model_class: str
    attention: bool = True
    bidirectional: bool = False
    encoder: bool = False
    cross_attention: bool = False
    state: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    indexed: tuple[str, ...] = ()
    media_by_rows: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """What a tiny random model of a config does with a packed row (see the module docstring).

    Attributes:
        layers: its layers (None where no model could be built, even on the meta device).
        failure: why it was not built or measured, or "".
        difference: the largest difference of a packed segment from its sample alone.
        untyped: the same with every token of type 0 (measured where ``difference`` is past the
            tolerance and the model takes token types).
        bounded: the same given the segments' boundaries (measured where ``difference`` is past the
            tolerance and layers carry state).
    """

    layers: Layers | None
    failure: str = ""
    difference: float | None = None
    untyped: float | None = None
    bounded: float | None = None


def keeps_segments_apart(difference: float | None) -> bool:
    return difference is not None and difference <= _TOLERANCE


def behaviour(config: Any, **settings: int) -> Behaviour:
    """What a tiny random model of ``config``'s model class does with a packed row, with
    ``settings`` set wherever the config or a sub-config holds them; once per config."""
    try:
        key = (type(config).__module__, type(config).__qualname__, config.to_json_string(use_diff=False),
               tuple(sorted(settings.items())))
    except (AttributeError, TypeError, ValueError) as exc:
        return Behaviour(None, f"its config cannot be written out to build a model of it ({exc})")
    if key not in _SEEN:
        _SEEN[key] = _behaviour(config, settings)
    return _SEEN[key]


def packed_segments_differ(config: Any, **settings: int) -> float | None:
    """The largest difference between a packed text segment and its sample alone on a tiny random
    model of ``config`` (see :func:`behaviour`); None where it cannot be measured."""
    return behaviour(config, **settings).difference


_SEEN: dict[tuple[Any, ...], Behaviour] = {}


def _behaviour(config: Any, settings: dict[str, int]) -> Behaviour:
    import torch

    from .language_models import nested_language_models

    built = model_class(config)
    nested = nested_language_models(config)
    if nested and (built is None or getattr(built, "forward", None) is torch.nn.Module.forward):
        # a model of sub-models runs none itself: a trainer runs the first, which reads the text
        # (an Omni model's thinker; its talker speaks the thinker's output and is trained apart)
        return behaviour(nested[0], **settings)
    if built is None:
        return Behaviour(None, f"transformers' auto mappings give its config class {type(config).__name__} no model "
                               f"class (register one with transformers.AutoModel.register)")
    try:
        model = _first_tiny_model(built, config, settings)
    except Exception as exc:  # a config this does not shrink: its layers read off the full model on meta
        failure = f"a tiny model of its config could not be built ({type(exc).__name__}: {_short(exc)})"
        try:
            with torch.device("meta"):
                layers = read_layers(built(config), built)
        except Exception as meta:
            return Behaviour(None, f"{failure}, nor its model on the meta device ({type(meta).__name__}: "
                                   f"{_short(meta)})")
        return Behaviour(layers, failure)
    layers = read_layers(model, built)
    device = "cuda" if layers.state and torch.cuda.is_available() else "cpu"
    try:
        measure = _Measure(model.to(device), device)
        try:
            difference = measure(typed=True)
        except KeyError as missing:  # sections the config leaves out and the model reads (5.10's Qwen2.5-VL)
            if missing.args[:1] != ("mrope_section",):
                raise
            measure = _Measure(_tiny_model(built, config, settings, "mrope_section").to(device), device)
            difference = measure(typed=True)
    except Exception as exc:  # a forward this does not fit: its language model's, else refused
        failure = f"a tiny model of its config fails on a packed row of text ({type(exc).__name__}: {_short(exc)})"
        language = _language_model(model)
        if language is None:
            return Behaviour(layers, failure)
        try:
            measure = _Measure(language, device)
            difference = measure(typed=True)
        except Exception:
            return Behaviour(layers, failure)
    untyped = bounded = None
    if not keeps_segments_apart(difference):
        untyped = _or_none(lambda: measure(typed=False)) if measure.type_key else None
        # transformers may refuse the boundaries without the kernels that read them: not kept apart
        bounded = _or_none(lambda: measure(typed=True, boundaries=True)) if layers.state else None
    return Behaviour(layers, "", difference, untyped, bounded)


def _or_none(run: Any) -> float | None:
    try:
        return float(run())
    except Exception:  # a run this does not fit tells nothing: the row is taken to mix its segments
        return None


def _language_model(model: Any) -> Any:
    """The language model inside ``model`` (a model whose own forward fails on text alone), or None."""
    try:
        language = model.get_decoder()
    except Exception:  # a model without one
        return None
    return language if language is not model and callable(getattr(language, "forward", None)) else None


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return (text[0][:200] if text else "no message")


#: The ways a config is shrunk, in order, until a model of it builds (see :func:`tiny_config`):
#: RoPE sections the model code defaults to, sized for the full head, stated; sizes the config's
#: checks tie to each other keeping its ratios; head counts derived from widths needing wider ones.
_SHRINKS: tuple[dict[str, Any], ...] = ({}, {"sections": "mrope_section"}, {"ratios": True}, {"width": 2 * WIDTH})


def _first_tiny_model(built: type, config: Any, settings: dict[str, int]) -> Any:
    """The tiny model of the first shrink that builds; the first failure where none does."""
    first: Exception | None = None
    for shrink in _SHRINKS:
        try:
            return _tiny_model(built, config, settings, **shrink)
        except Exception as exc:  # the next shrink may build; the first failure tells the most
            first = first or exc
    assert first is not None
    raise first


def _tiny_model(built: type, config: Any, settings: dict[str, int], sections: str = "", **shrink: Any) -> Any:
    import torch

    tiny = tiny_config(config, settings, sections, **shrink)
    tiny._attn_implementation = "sdpa" if getattr(built, "_supports_sdpa", True) else "eager"
    try:
        fit_rope_sections(built, tiny)  # builds it on the meta device
    except ValueError as refused:  # a part of it (a media tokenizer, a vision tower) without sdpa
        if tiny._attn_implementation != "sdpa" or "does not support an attention implementation" not in str(refused):
            raise
        tiny._attn_implementation = "eager"
        fit_rope_sections(built, tiny)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = built(tiny)
    return model.eval().float()


class _Measure:
    """Runs a packed row of text segments and each segment alone through ``model``."""

    def __init__(self, model: Any, device: str) -> None:
        import torch

        self.model, self.device = model, device
        self.lengths = [prefix + suffix for prefix, suffix in _SEGMENTS]
        allowed = _plain_token_ids(model.config.to_dict())
        generator = torch.Generator().manual_seed(0)
        self.rows = [allowed[torch.randint(len(allowed), (1, length), generator=generator)].to(device)
                     for length in self.lengths]
        self.types = [torch.tensor([[0] * prefix + [1] * suffix], device=device) for prefix, suffix in _SEGMENTS]
        takes = inspect.signature(model.forward).parameters
        self.type_key = next((name for name in ("token_type_ids", "mm_token_type_ids") if name in takes), None)
        self.kwargs = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in takes.values())

    def run(self, ids: Any, token_types: Any, **extra: Any) -> Any:
        if self.type_key is not None:
            extra[self.type_key] = token_types
        out = self.model(input_ids=ids, use_cache=False, **extra)
        hidden = getattr(out, "last_hidden_state", None)
        return (hidden if hidden is not None else out[0])[0]

    def __call__(self, *, typed: bool, boundaries: bool = False) -> float:
        import torch

        types = self.types if typed else [torch.zeros_like(types) for types in self.types]
        extra: dict[str, Any] = {}
        if boundaries and self.kwargs:
            bounds = torch.tensor([0, *self.lengths], device=self.device).cumsum(0).to(torch.int32)
            extra = {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": max(self.lengths),
                     "max_length_k": max(self.lengths),
                     "seq_idx": torch.cat([torch.full((length,), index, dtype=torch.int32, device=self.device)
                                           for index, length in enumerate(self.lengths)])[None]}
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            alone = [self.run(ids, token_types) for ids, token_types in zip(self.rows, types)]
            positions = torch.cat([torch.arange(length, device=self.device) for length in self.lengths])[None]
            found = []
            # positions restarting per segment, in each shape models take them: one row; a text row and
            # three (t, h, w) rows; three rows (a text segment's are equal)
            for rows in (None, 4, 3):
                shaped = positions if rows is None else positions[None].expand(rows, 1, -1)
                try:
                    packed = self.run(torch.cat(self.rows, dim=1), torch.cat(types, dim=1), position_ids=shaped,
                                      **extra)
                except Exception:
                    if rows is None:
                        raise
                    continue
                found.append(max(float((mine - own).abs().max())
                                 for mine, own in zip(packed.split(self.lengths), alone)))
                if found[-1] <= _TOLERANCE:
                    break
        return min(found)


def _plain_token_ids(values: dict[str, Any]) -> Any:
    """Ids below every vocabulary of the config (at most 64) that name no special token (an image
    placeholder would ask for pixels): the measured rows' tokens."""
    import torch

    vocabularies, special = [64], set()
    pending = [values]
    while pending:
        current = pending.pop()
        for key, value in current.items():
            if not isinstance(key, str):
                continue
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


# -- the layers, read off the built modules -----------------------------------------------------


def read_layers(model: Any, built: type) -> Layers:
    """What the language-model layers of ``model`` (built from a config, on any device) are: the
    layer stacks of the modules that hold a language-model config."""
    import torch

    from .language_models import text_configs

    texts = tuple({type(text) for text in text_configs(model.config)})
    found: dict[str, Any] = {"attention": False, "bidirectional": False, "encoder": False, "cross_attention": False}
    state: dict[str, None] = {}
    kernels: set[str] = set()
    indexed: dict[str, None] = {}
    for owner in model.modules():
        if not isinstance(getattr(owner, "config", None), texts):
            continue
        kinds = getattr(owner.config, "layer_types", None)
        found["bidirectional"] |= getattr(owner.config, "is_causal", True) is False  # read by its mask
        for stack in owner.children():
            if not isinstance(stack, torch.nn.ModuleList):
                continue
            for index, layer in enumerate(stack):
                kind = kinds[index] if isinstance(kinds, (list, tuple)) and index < len(kinds) else None
                conv, recurrent = _read_layer(layer, found, texts)
                if conv or recurrent:
                    state[str(kind or type(layer).__name__)] = None
                    kernels.update(("causal-conv1d",) * conv + ("flash-linear-attention",) * recurrent)
                if any("indexer" in name for name, _ in layer.named_modules()):
                    indexed[str(kind or type(layer).__name__)] = None
    return Layers(built.__name__, found["attention"], found["bidirectional"], found["encoder"],
                  found["cross_attention"], tuple(state), tuple(sorted(kernels)), tuple(indexed),
                  media_by_rows(built))


def _read_layer(layer: Any, found: dict[str, Any], texts: tuple[type, ...]) -> tuple[bool, bool]:
    """Note in ``found`` what attention ``layer`` holds; whether it holds a causal convolution
    (a depthwise ``Conv1d``) and a recurrent mixer (a decay parameter ``A_log``)."""
    import torch

    conv = recurrent = False
    for module in _own_modules(layer, texts):
        try:
            takes: Any = inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            takes = {}
        if "encoder_hidden_states" in takes:
            found["encoder"] = True
        cross = bool(getattr(module, "is_cross_attention", False)) or any("cross_attention" in name for name in takes)
        found["cross_attention"] |= cross
        if isinstance(getattr(module, "is_causal", None), bool):
            found["attention"] = True
            found["bidirectional"] |= not module.is_causal and not cross and not getattr(module, "is_decoder", False)
        if isinstance(module, torch.nn.Conv1d) and module.groups > 1 and module.groups == module.in_channels:
            conv = True
        recurrent |= "A_log" in dict(module.named_parameters(recurse=False))
    return conv, recurrent


def _own_modules(layer: Any, texts: tuple[type, ...]) -> list[Any]:
    """The modules of ``layer`` but those of a sub-model built from a config of its own other than
    a language model's (a projector's Q-Former, a vision tower): their attention is not the row's."""
    own, pending = [], [layer]
    while pending:
        module = pending.pop()
        config = getattr(module, "config", None)
        if module is not layer and hasattr(config, "to_dict") and not isinstance(config, texts):
            continue
        own.append(module)
        pending += list(module.children())
    return own


def media_by_rows(model_type: type) -> tuple[str, ...]:
    """The arguments of ``model_type.forward`` that count media per sample (``*_per_sample``) and
    that it splits the media by, then indexes with a loop over the batch's rows (a packed row, one
    row of several samples, would get the first sample's media only). A ``forward`` taking such
    counts whose code cannot be read is taken to do so."""
    forward: Any = getattr(model_type, "forward", None)
    try:
        counts = [name for name in inspect.signature(forward).parameters if name.endswith("_per_sample")]
    except (TypeError, ValueError):
        return ()
    if not counts:
        return ()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):
        return tuple(counts)
    return tuple(name for name in counts if _indexed_by_rows(tree, name))


def _indexed_by_rows(tree: ast.AST, count: str) -> bool:
    """Whether a value computed from ``count`` is indexed by the variable of a ``for ... in range(...)``."""
    derived = {count}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _names(node.value) & derived:
            derived |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Call)
                and getattr(node.iter.func, "id", None) == "range"):
            continue
        for inner in ast.walk(node):
            if (isinstance(inner, ast.Subscript) and _names(inner.value) & derived
                    and node.target.id in _names(inner.slice)):
                return True
    return False


def _names(node: ast.AST) -> set[str]:
    return {inner.id for inner in ast.walk(node) if isinstance(inner, ast.Name)}
