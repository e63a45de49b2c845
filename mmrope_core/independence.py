"""Whether a kernel gives a sample the positions it gives it alone wherever the sample stands in
a batch, decided once per kernel for every binding alike.

A reference that counts media across the batch's rows (HunYuan-VL numbers a batch's images in
order) gives a sample other positions after a sample with media than alone: its packed rows are
refused and a padded batch is computed sample by sample. A kernel says so itself
(:attr:`~mmrope_core.kernel.RopeKernel.samples_independent` True or False: a batched kernel the
conformance suite holds to it); one that does not is shown here, on a sample with media drawn
from its plugin's example cases for the engine's own processor and config: alone, placed twice
in a batch, and after another sample. What cannot be shown (no example case fits, the kernel
fails on the batch) is taken as not independent: it is never assumed.
"""

from __future__ import annotations

import random
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from .errors import MmropeError

#: Samples drawn from each example case before it is given up as holding no media.
_DRAWS = 8

_decided: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_by_identity: dict[int, tuple[Any, bool]] = {}
_lock = threading.RLock()  # a probe that builds an engine of its own may ask again


def samples_independent(engine: Any) -> bool:
    """Whether ``engine``'s kernel computes each sample of a batch as the sample alone: its own
    declaration, else shown on its plugin's example samples (once per kernel), else False."""
    kernel = getattr(engine.binding, "kernel", None)
    if kernel is None:  # 1-D positions count each row's own mask
        return True
    declared = getattr(kernel, "samples_independent", None)
    if isinstance(declared, bool):
        return declared
    with _lock:  # engines built on several threads probe once
        try:
            if kernel not in _decided:
                _decided[kernel] = shown_independent(engine)
            return _decided[kernel]
        except TypeError:  # neither hashable nor weakly referable: kept by identity (and alive)
            if id(kernel) not in _by_identity:
                _by_identity[id(kernel)] = (kernel, shown_independent(engine))
            return _by_identity[id(kernel)][1]


def shown_independent(engine: Any) -> bool:
    """Whether a sample with media from the binding plugin's example cases gets, placed twice in
    a batch and after another sample, the positions it gets alone; False where none can be drawn
    or the kernel fails on the batch."""
    return probe(engine) is True


def probe(engine: Any) -> bool | None:
    """What the binding plugin's example cases show: True (a sample with media gets its positions
    alone wherever it stands), False (a sample gets others, or the kernel fails on the batch it
    computes alone), None (no case fits the engine's processor and config)."""
    rng = random.Random("mmrope samples independent")
    for case in _cases(engine):
        for draw in (_from_generator, _from_processor):  # the generator's arguments cost no processor call
            verdict = draw(engine, case, rng)
            if verdict is not None:
                return verdict
    return None


def _cases(engine: Any) -> Iterator[Any]:
    plugins, name = getattr(engine, "_plugins", None), getattr(engine, "plugin_name", None)
    if plugins is None or name is None:
        return
    try:
        answers = plugins.results_of(name, "example_cases")
    except MmropeError:
        return
    for cases in answers:
        yield from cases


def _from_processor(engine: Any, case: Any, rng: random.Random) -> bool | None:
    """The case's processor calls run by the engine's processor: a sample (one with media where
    any has) alone, twice in a batch and after another sample, padded on either side. None where
    the calls do not fit the processor, or where no sample holds media and none differs."""
    try:
        outputs = [engine.process(**sample) for sample in case.samples(engine.processor, rng)]
        with_media = [output for output in outputs if _media_keys(engine, output)]
        sample = (with_media or outputs)[0]
        other = outputs[0] if outputs[0] is not sample else outputs[-1]
        one = engine.batch([sample])
        alone = engine.compute_position_ids(*one)[0][..., one[1][0].bool()]
    except Exception:  # a case of another processor or model type: it cannot tell
        return None
    try:
        for batch, row in (([sample, sample], 1), ([other, sample], 1), ([sample, other], 0)):
            for side in ("right", "left"):
                ids, mask, inputs = engine.batch(batch, padding_side=side)
                positions = engine.compute_position_ids(ids, mask, inputs)
                if not torch.equal(positions[row][..., mask[row].bool()], alone):
                    return False
    except Exception:  # alone it computes, in a batch it fails: not shown independent
        return False
    return True if with_media else None


def _from_generator(engine: Any, case: Any, rng: random.Random) -> bool | None:
    """The case's generated ``get_rope_index`` arguments for the engine's processor and config:
    samples with media, each placed twice in a batch. None where the generator does not fit them
    or draws no media."""
    if case.batches is None or engine.rope_kind != "mrope":
        return None
    shown = False
    for _ in range(_DRAWS):
        try:
            sample = dict(case.batches(engine.processor, engine.config, rng))
            ids, mask = sample.pop("input_ids"), sample.pop("attention_mask", None)
            if not _media_keys(engine, sample) or ids.shape[0] != 1:
                continue
            alone, deltas = engine.get_rope_index(ids, mask, **sample)
        except Exception:  # a generator of another processor or model type
            return None
        twice = {key: torch.cat([value, value]) if isinstance(value, torch.Tensor) else value
                 for key, value in sample.items()}
        try:
            positions, twice_deltas = engine.get_rope_index(
                torch.cat([ids, ids]), None if mask is None else torch.cat([mask, mask]), **twice)
        except Exception:  # alone it computes, twice it fails: not shown independent
            return False
        if not (torch.equal(positions[:, 0], alone[:, 0]) and torch.equal(positions[:, 1], alone[:, 0])
                and torch.equal(twice_deltas[1], deltas[0])):
            return False
        shown = True
    return True if shown else None


def _media_keys(engine: Any, inputs: Mapping[str, Any]) -> set[str]:
    """The media keys a sample holds, as the kernel reads them: ``get_rope_index`` arguments, from
    a processor's outputs where given those (only the kernel's :attr:`input_keys`, where it names any)."""
    if "input_ids" in inputs:
        inputs = engine.rope_index_kwargs({key: value for key, value in inputs.items()
                                           if key not in ("input_ids", "attention_mask")})
    keys = {key for key, value in inputs.items()
            if value is not None and not isinstance(value, bool)
            and not (isinstance(value, torch.Tensor) and value.numel() == 0)}
    wanted = set(getattr(engine.binding.kernel, "input_keys", ()) or ())
    return keys & wanted if wanted else keys
