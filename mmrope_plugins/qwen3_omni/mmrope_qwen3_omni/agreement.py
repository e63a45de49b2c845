"""Does a kernel agree with the installed thinker's ``get_rope_index``? The audio-length rule under
which it does on the probe batches, worked out once per process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmrope_core import MmropeError
from mmrope_core.reference import probe_once

from .audio import AUDIO_RULES
from .families import Family
from .fast import FastRopeIndex
from .kernel import Kernel
from .layout import tokens_of
from .probe import probe_batches
from .reference import ReferenceRopeIndex


def agreeing_audio_rule(family: Family, thinker: Any, markers: Mapping[str, int],
                        kernel: type[Kernel] = FastRopeIndex) -> str | None:
    """The audio-length rule under which ``kernel`` equals the installed reference on probe
    batches, or None (with one warning per process) when none does."""

    def probe() -> str | None:
        reference = ReferenceRopeIndex(family, thinker, markers)
        tokens = tokens_of(thinker, markers)
        return next((rule for rule in AUDIO_RULES[family.float_positions]
                     if _agrees(kernel(family, thinker, markers, rule), reference,
                                probe_batches(family, tokens, reference.merge, thinker, rule))), None)

    key = ("qwen3_omni", kernel.__name__, family.name, thinker.position_id_per_seconds,
           getattr(thinker, "seconds_per_chunk", None), getattr(thinker.audio_config, "n_window", None),
           int(thinker.vision_config.spatial_merge_size))
    return probe_once(key, probe, fast=f"mmrope-qwen3-omni: the fast {family.name} implementation")


def _agrees(fast: Kernel, reference: ReferenceRopeIndex, batches) -> bool:
    for batch in batches:
        try:
            want = reference(**batch)
        except Exception:  # the batch's audio lengths follow another rule than this reference's
            return False
        try:
            got = fast.rope_index(**batch)
        except MmropeError:  # refuses what this reference places
            return False
        if not _equal(got, want):
            return False
    return True


def _equal(got, want) -> bool:
    return all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))
