"""The positions a rollout engine gave a sequence: its prompt prefilled, its generated tokens decoded.

A rollout engine computes positions twice. When it prefills a request's prompt, every token gets
the family's positions of the whole prompt; when it decodes, each generated token gets its index
in the sequence plus the prompt's delta (largest position + 1 - prompt length), the same on every
row. Where positions are integers and text after a media item resumes past its largest
position, the two agree and a prefill of the whole sequence is the rollout's positions. SGLang
0.5.23 casts Qwen3-Omni's fractional positions to int64 (truncating toward zero) in both: a
prefilled token at ``trunc(position)``, a decoded one at ``index + trunc(delta)``, which differ
by one where the delta is negative and fractional. :func:`decoded_positions` gives each token its
place from a prefill of the whole sequence and the tokens the rollout generated.
"""

from __future__ import annotations

import torch

#: packed rows: segment numbers sit above the largest position's bits (float32 bits, or integers)
_SEGMENT_SHIFT = 2**40


def decoded_positions(prefill: torch.Tensor, generated: torch.Tensor | None, attention_mask: torch.Tensor | None = None,
                      cu_seqlens: torch.Tensor | None = None, deltas: torch.Tensor | None = None, *,
                      out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The int64 positions a rollout gave each token, and its int64 deltas.

    Args:
        prefill: ``(R, B, L)`` positions of a prefill of each whole sample, float32 (where they
            can be fractional) or integer, not negative.
        generated: bool ``(B, L)``, True at the tokens the rollout generated (never at padding
            nor at a sample's first token), or None. Each run of them is one request's decode,
            after a prompt of every token before it in the sample.
        attention_mask: bool ``(B, L)`` or None; one sample per row.
        cu_seqlens: for one packed ``(1, L)`` row (no mask), the samples' boundaries.
        deltas: ``(S, 1)`` deltas of the prefill, or None.
        out: an int64 tensor shaped like ``prefill`` (any strides) to write the positions into.

    Returns:
        ``prefill`` truncated toward zero, except at generated tokens: their index in the sample
        plus the truncated delta of everything before their run, on every row. With ``deltas``,
        the truncated deltas, those of samples ending in a generated run being that run's.
    """
    positions = (torch.empty(prefill.shape, dtype=torch.int64, device=prefill.device) if out is None else out)
    positions.copy_(prefill)  # (float to integer conversion truncates toward zero)
    deltas = None if deltas is None else deltas.to(torch.int64)
    if generated is None:
        return positions, deltas
    length = generated.shape[1]
    rows, columns = generated.nonzero(as_tuple=True)  # the generated tokens, in order
    if not rows.numel():
        return positions, deltas
    starts = torch.ones_like(rows, dtype=torch.bool)  # the first token of each run
    starts[1:] = (rows[1:] != rows[:-1]) | (columns[1:] != columns[:-1] + 1)
    run = starts.cumsum(0) - 1
    first_row, first_column = rows[starts], columns[starts]
    segment = None
    last = torch.arange(generated.shape[0], device=generated.device) * length + length - 1  # each sample's last token
    if cu_seqlens is not None:
        bounds = cu_seqlens.to(device=generated.device, dtype=torch.int64)
        prompt_tokens = first_column - bounds[torch.searchsorted(bounds, first_column, right=True) - 1]
        segment = torch.repeat_interleave(torch.arange(bounds.numel() - 1, device=generated.device), bounds.diff())
        last = bounds[1:] - 1
    elif attention_mask is None:
        prompt_tokens = first_column
    else:
        prompt_tokens = attention_mask.to(torch.int32).cumsum(dim=1, dtype=torch.int32)[first_row, first_column] - 1
        last = last - attention_mask.flip(1).to(torch.int8).argmax(1)
    # each run's delta, as the rollout computes its prompt's in the positions' dtype: largest + 1 - tokens
    largest = _running_max(prefill.amax(0), attention_mask, segment)[first_row, first_column - 1]
    run_delta = ((largest + 1) - prompt_tokens.to(largest.dtype)).to(torch.int64)
    decoded = (columns - first_column[run]) + prompt_tokens[run] + run_delta[run]
    if positions.is_contiguous():  # (several times faster than indexing rows and columns)
        positions.view(positions.shape[0], -1).index_copy_(1, rows * length + columns,
                                                            decoded.expand(positions.shape[0], -1))
    else:
        positions[:, rows, columns] = decoded
    if deltas is not None:
        flat = rows * length + columns
        found = torch.searchsorted(flat, last).clamp(max=flat.numel() - 1)
        ended = flat[found] == last
        deltas[ended, 0] = run_delta[run[found[ended]]]
    return positions, deltas


def _running_max(values: torch.Tensor, attention_mask: torch.Tensor | None, segment: torch.Tensor | None) -> torch.Tensor:
    """Each token's largest value so far in its row (padding counting 0, which no position is
    below), or with ``segment`` (``(L,)`` numbers of a packed row's samples) so far in its
    sample: order-preserving integer keys with the segment's number above them restart the
    maximum at every sample."""
    if attention_mask is not None:
        values = values.masked_fill(~attention_mask, 0)
    if segment is None:
        return values.cummax(dim=1).values
    floats = values.is_floating_point()
    if floats and values.dtype != torch.float32:
        raise TypeError(f"positions of packed rows must be float32 or integers, got {values.dtype}")
    keys = values.view(torch.int32).to(torch.int64) if floats else values.to(torch.int64)  # (non-negative floats' bits are ordered)
    offset = segment * _SEGMENT_SHIFT
    running = (keys + offset).cummax(dim=1).values - offset
    return running.to(torch.int32).view(torch.float32) if floats else running.to(values.dtype)
