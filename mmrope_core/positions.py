"""Positions that need no plugin: 1-D RoPE positions and the text row of the 4-row layout."""

from __future__ import annotations

import torch


def one_d_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``clip(cumsum(mask) - 1, 0)`` as ``(B, L)`` int64: valid tokens count 0, 1, 2, ...;
    left padding holds 0 and right padding repeats the last position."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape).clone()
    return (attention_mask.cumsum(dim=1) - 1).clamp_(min=0)


def text_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Row 0 of the ``(B, 4, L)`` layout: 0..n-1 over valid tokens, 1 at padding (``(B, L)`` int64)."""
    if attention_mask is None:
        return one_d_positions(input_ids, None)
    return torch.where(attention_mask, attention_mask.cumsum(dim=1) - 1, 1)
