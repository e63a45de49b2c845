"""The kernel contract: what a plugin gives the engine to compute one family's positions."""

from __future__ import annotations

import abc
from collections.abc import Collection
from typing import Any

import torch

from .positions import segment_offsets, text_positions


class RopeKernel(abc.ABC):
    """Computes a model family's M-RoPE positions from token ids and the processor's outputs.

    A kernel implements one method, :meth:`rope_index`; the engine calls it on every layout it
    supports (batches padded on either side, and packed rows) and derives the rest. The engine
    checks the token ids and the mask before calling, so a kernel may rely on them:

    - ``input_ids`` is a ``(B, L)`` integer tensor; the kernel builds whatever token types it
      needs from it (the caller's ``mm_token_type_ids`` never reach it).
    - ``attention_mask`` is a bool ``(B, L)`` tensor, or None when every token is valid; every
      row holds at least one valid token.
    - ``inputs`` are the keyword arguments the plugins' ``get_rope_index_kwargs`` derive from the
      processor's outputs (grids, timing, audio lengths...), or those a caller of
      ``engine.get_rope_index`` passes. Treat a key you do not take as the family's reference
      does: ignore it where the reference takes ``**kwargs``, else raise
      :class:`~mmrope_core.InvalidInputError` naming it.
    - With :attr:`places_packed_rows` set, ``cu_seqlens`` may be given: then ``input_ids`` is one
      packed ``(1, T)`` row of K samples back to back, ``attention_mask`` is None, and
      ``cu_seqlens`` is a ``(K + 1,)`` int64 tensor of their boundaries from 0 to T. Each
      segment is computed as the sample alone, media taken in order across segments; deltas
      are per segment, and "sample k" in errors means segment k. Placeholders on both sides of a
      boundary belong to two items; where the parts do not fit the media, raise
      :class:`~mmrope_core.SegmentCutError` (the boundary cuts an item in two). Without the flag
      the engine unpacks packed rows into a padded batch and never passes ``cu_seqlens``.
    - With :attr:`reads_generated_mask` set, ``generated_mask`` may be given: a bool tensor shaped
      like ``input_ids``, True at the tokens a rollout engine generated (each run of them one
      request's decode), never at padding nor at a sample's (segment's) first token; None where no
      token was generated. Without the flag the engine checks it and keeps it for itself: the
      kernel's positions are then those of every token, generated or not.

    Raise :class:`~mmrope_core.PlaceholderMismatchError` (naming the sample and the item) where
    placeholders and media disagree; any other exception is reported as the plugin's failure.

    Example::

        class MyKernel(RopeKernel):
            def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, image_grid_thw=None):
                ...
                return positions, deltas        # (3, B, L), (B, 1)
    """

    #: dtype of :meth:`position_ids`; int64 unless the family's reference computes other positions.
    position_dtype: torch.dtype = torch.int64
    #: :meth:`rope_index` and :meth:`position_ids` take ``cu_seqlens`` (see the class docstring).
    places_packed_rows: bool = False
    #: Each sample's positions depend on its own tokens and media alone, wherever it stands in a
    #: batch: True for a batched kernel that computes every row alike (the conformance suite holds
    #: it to that); False for a reference that counts media across the batch (HunYuan-VL numbers
    #: a batch's images in order). None: the core shows it on the plugin's example samples, once
    #: per kernel (:mod:`mmrope_core.independence`), and what it cannot show counts as False. Not
    #: independent, packed rows are refused and padded batches computed sample by sample.
    samples_independent: bool | None = None
    #: Rows of :meth:`rope_index`'s positions: 3 (``t, h, w``) for most families; a model with
    #: more axes (HunYuan-VL's four xD-RoPE sections) sets its own, and :meth:`position_ids`
    #: then has one more.
    rope_rows: int = 3
    #: The positions a rollout engine gives the tokens it generates differ from a prefill of the
    #: whole sequence (SGLang's Qwen3-Omni decodes at ``index + trunc(delta)``): :meth:`rope_index`
    #: and :meth:`position_ids` take ``generated_mask`` (see the class docstring).
    reads_generated_mask: bool = False
    #: The keyword inputs :meth:`rope_index` reads (grids, seconds, switches), so that
    #: ``engine.get_rope_index`` can name a misspelt one; empty where a kernel does not say.
    input_keys: Collection[str] = ()

    @abc.abstractmethod
    def rope_index(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        **inputs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The family's ``get_rope_index``: ``(3, B, L)`` positions (``(rope_rows, B, L)``) and
        ``(B, 1)`` deltas (``max + 1 - valid tokens``), with padding holding what the family's
        reference puts there; with ``cu_seqlens``, ``(3, 1, T)`` and ``(K, 1)``."""

    def position_ids(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """The ``(B, 4, L)`` layout the model takes (``(B, rope_rows + 1, L)``), in
        :attr:`position_dtype`: row 0 counts each sample's valid tokens from 0 (1 at padding; with
        ``cu_seqlens``, each segment's tokens), the other rows are :meth:`rope_index`'s positions. Override it where a kernel writes the
        four rows faster than this default does."""
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        positions, _ = self.rope_index(input_ids, attention_mask, **packed, **inputs)
        out = torch.empty(input_ids.shape[0], self.rope_rows + 1, input_ids.shape[1], dtype=self.position_dtype,
                          device=input_ids.device)
        if cu_seqlens is None:
            text_positions(attention_mask, out=out[:, 0])
        else:
            out[0, 0] = segment_offsets(cu_seqlens, input_ids.shape[1]).to(input_ids.device)
        out[:, 1:] = positions.transpose(0, 1)
        return out
