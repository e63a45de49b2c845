"""Positions that need no plugin: 1-D RoPE positions and the text row of the 4-row layout."""

from __future__ import annotations

import torch


def one_d_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``clip(cumsum(mask) - 1, 0)`` as ``(B, L)`` int64: valid tokens count 0, 1, 2, ...;
    left padding holds 0 and right padding repeats the last position."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape).clone()
    return (attention_mask.cumsum(dim=1) - 1).clamp_(min=0)


def text_positions(attention_mask: torch.Tensor | None, *, out: torch.Tensor) -> torch.Tensor:
    """Row 0 of the ``(B, 4, L)`` layout, written into ``out`` ``(B, L)``: 0..n-1 over valid
    tokens, 1 at padding."""
    if attention_mask is None:
        return out.copy_(torch.arange(out.shape[1], device=out.device))
    torch.cumsum(attention_mask, dim=1, out=out).sub_(1)
    return out.masked_fill_(attention_mask.logical_not(), 1)


def segment_offsets(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """Each token's index within its segment, for a packed row of ``length`` tokens with
    boundaries ``cu_seqlens``."""
    bounds = cu_seqlens.cpu().long()
    return torch.arange(length) - torch.repeat_interleave(bounds[:-1], bounds.diff())
