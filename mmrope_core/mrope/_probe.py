"""Is the batched kernel still the installed transformers' rule? Checked once per process on
small batches covering text, images, videos with fractional seconds and both paddings."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..conventions import TRANSFORMERS, asked, convention, described
from ..errors import InvalidInputError, UnknownConventionError
from ..kernel import RopeKernel
from ..reference import kernels_agree, probe_once
from ..temporal import TemporalRule
from ..tiny import padded_batch
from ..types import RopeBinding
from ._family import MropeFamily
from ._kernel import MropeKernel


def fast_kernel(family: MropeFamily, reference: RopeKernel,
                rules: Sequence[TemporalRule] | None = None) -> MropeKernel | None:
    """The batched kernel of ``family`` if it equals ``reference`` on :func:`probe_batches`, under
    the family's temporal rule or, for families that time their videos, one of ``rules`` (the
    rules the family's releases have followed, named by its plugin, each taken at the family's
    ``per_second``). None, with one warning per process, when no rule does: the caller then binds
    ``reference``.

    Example::

        reference = ReferenceKernel(MyVLModel, config, token_types=family.token_types())
        kernel = fast_kernel(family, reference) or reference
    """
    own = family.temporal
    tried: list[TemporalRule | None] = [own] if own is None else list(dict.fromkeys(
        (own, *(dataclasses.replace(rule, per_second=own.per_second) for rule in rules or ()))))

    def probe() -> int | None:  # the index of the rule that agrees
        batches = list(probe_batches(family))
        for index, rule in enumerate(tried):
            if kernels_agree(MropeKernel(dataclasses.replace(family, temporal=rule)), reference, batches):
                return index
        return None

    key = ("mrope", dataclasses.replace(family, temporal=None), tuple(tried),
           getattr(reference, "probe_key", type(reference)))
    index = probe_once(key, probe, fast=f"the batched {family.name} kernel")
    return None if index is None else MropeKernel(dataclasses.replace(family, temporal=tried[index]))


def probe_batches(family: MropeFamily) -> Iterator[dict[str, Any]]:
    """Two samples (text, an image, a video of three frames, text; the second one token shorter),
    padded on the right and on the left, with token ids laid out as the family's processor lays
    them out: keyword arguments of ``rope_index``."""
    merge = family.spatial_merge_size
    image, video = (1, 2 * merge, 3 * merge), (3, 2 * merge, 2 * merge)
    specials = {family.image_token_id, family.video_token_id, *(family.video_markers or ())}
    text = max(token for token in specials if token is not None) + 1
    row = [text] * 3 + [family.image_token_id] * 6 + [text] * 2
    if family.has_video:
        frame = [family.image_token_id if family.video_markers else family.video_token_id] * 4
        if family.per_frame_video:
            frames = [token for _ in range(video[0]) for token in [text, text, *frame]]
        else:
            frames = frame * video[0]
        if family.video_markers:
            frames = [family.video_markers[0], *frames, family.video_markers[1]]
        row += frames
    rows = [row + [text] * 3, row + [text] * 2]
    for left in (False, True):
        ids, mask = padded_batch(rows, text, left=left, mask_dtype=torch.bool)
        batch: dict[str, Any] = {"input_ids": ids, "attention_mask": mask,
                                 family.image_key: torch.tensor([image, image])}
        _, video_key, seconds_key = family.keys
        if video_key is not None:
            batch[video_key] = torch.tensor([video, video])
        if seconds_key is not None:
            batch[seconds_key] = torch.tensor([0.5, 1.3])
        yield batch


IMPLEMENTATIONS = ("fast", "reference")


def bind_mrope(family: MropeFamily, reference: RopeKernel, options: Mapping[str, Any],
               conventions: Collection[str] = (TRANSFORMERS,), *,
               variants: Mapping[str, MropeFamily] | None = None,
               rules: Sequence[TemporalRule] | None = None) -> RopeBinding:
    """The binding of a family of placeholder runs, for ``bind_rope_index``: the batched kernel, or the
    ``reference`` kernel where ``options`` ask for ``implementation="reference"`` or where the
    batched kernel does not reproduce the installed transformers (see :func:`fast_kernel`, which
    tries ``rules``).

    ``conventions`` are the position conventions the family offers (``options["convention"]``
    chooses; see :mod:`mmrope_core.conventions`). Each one other than ``transformers`` names in
    ``variants`` the family as that convention computes it (e.g. ``resume_past_frames`` and a
    ``temporal`` rule of its own), built by the plugin; the batched kernel computes it, and no
    reference does, so ``implementation`` must be ``"fast"``.

    Example::

        family = MropeFamily("My-VL", spatial_merge_size=2, image_token_id=processor.image_token_id,
                             image_key="image_grids")
        reference = ReferenceKernel(MyVLModel, config, token_types=family.token_types(),
                                    check=MropeKernel(family).check)
        return bind_mrope(family, reference, options)
    """
    variants = variants or {}
    missing = [name for name in conventions if name != TRANSFORMERS and name not in variants]
    if missing:
        raise TypeError(f"bind_mrope: conventions {missing} of {family.name} need their family in variants=")
    chosen = convention(options, family.name, conventions)
    implementation = options.get("implementation", "fast")
    if implementation not in IMPLEMENTATIONS:
        raise InvalidInputError(f"implementation={implementation!r} is not an implementation of {family.name}; use "
                                f"one of {IMPLEMENTATIONS}")
    if chosen != TRANSFORMERS:
        if implementation == "reference":
            raise UnknownConventionError(
                f"implementation='reference' is transformers' own get_rope_index: it has no {chosen} convention; "
                f"drop implementation= (the batched kernel follows {chosen}) or the convention"
            )
        return RopeBinding("mrope", MropeKernel(variants[chosen]), "fast",
                           f"{family.name}, batched kernel{described(asked(options))}")
    if implementation == "reference":
        return RopeBinding("mrope", reference, "reference", f"{family.name}, transformers reference")
    kernel = fast_kernel(family, reference, rules)
    if kernel is None:
        return RopeBinding("mrope", reference, "reference",
                           f"{family.name}, transformers reference (the batched kernel disagrees with this transformers)")
    rule = f" (temporal ids {kernel.family.temporal})" if kernel.family.temporal is not None else ""
    return RopeBinding("mrope", kernel, "fast", f"{family.name}, batched kernel{rule}")
