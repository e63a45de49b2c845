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

The work is a pass over the prefill's positions (their truncation, and the largest of each stretch
between a sample's start and a run's) and what is per run or per generated token, in numpy on
the host: no Python runs per token, run or sample. A kernel of media items
(:class:`mmrope_core.items.ItemKernel`) writes the same positions in its own pass.
"""

from __future__ import annotations

import numpy as np
import torch

#: a sample's number sits above any position's bits (float32's, or an integer's) in a running maximum
_SAMPLE_SHIFT = 2**40


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
    if prefill.device.type != "cpu":  # the work is on the host, where the kernels place positions too
        def host(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.cpu()

        positions, host_deltas = decoded_positions(prefill.cpu(), host(generated), host(attention_mask),
                                                   host(cu_seqlens), host(deltas))
        positions = positions.to(prefill.device) if out is None else out.copy_(positions)
        return positions, None if host_deltas is None else host_deltas.to(prefill.device)
    positions = torch.empty(prefill.shape, dtype=torch.int64) if out is None else out
    np.copyto(positions.numpy(), prefill.numpy(), casting="unsafe")  # truncates toward zero, twice torch's speed
    deltas = None if deltas is None else deltas.to(torch.int64)
    if generated is None:
        return positions, deltas
    tokens = np.flatnonzero(generated.numpy())  # the generated tokens, by flat index (row * L + column)
    if not tokens.size:
        return positions, deltas
    runs = _Runs(tokens, (generated.shape[0], generated.shape[1]), None if attention_mask is None else attention_mask.numpy(),
                 None if cu_seqlens is None else cu_seqlens.numpy())
    largest = runs.largest_before(prefill.numpy())
    # each run's delta, as the rollout computes its prompt's, in the positions' dtype: largest + 1 - tokens
    run_delta = ((largest + 1) - runs.prompt_tokens.astype(largest.dtype)).astype(np.int64)
    decoded = torch.from_numpy(runs.index(run_delta))
    flat = torch.from_numpy(tokens)
    if positions.is_contiguous():  # (several times faster than indexing rows and columns)
        positions.view(positions.shape[0], -1).index_copy_(1, flat, decoded.expand(positions.shape[0], -1))
    else:
        positions[:, flat // generated.shape[1], flat % generated.shape[1]] = decoded
    if deltas is not None:
        at = np.searchsorted(tokens, runs.last).clip(max=tokens.size - 1)
        ended = (tokens[at] == runs.last) & (runs.last >= runs.first)  # samples whose last token was generated
        deltas[torch.from_numpy(ended), 0] = torch.from_numpy(run_delta[runs.run[at[ended]]])
    return positions, deltas


class _Runs:
    """The runs of generated tokens (flat indices ``tokens``, in order) of a batch: for each
    token its run; for each run its first token and the tokens before it in its sample; each
    sample's first and last token. Runs never cross samples: no sample begins with a generated
    token."""

    def __init__(self, tokens: np.ndarray, shape: tuple[int, int], mask: np.ndarray | None,
                 cu_seqlens: np.ndarray | None) -> None:
        rows, length = shape
        self.tokens = tokens
        self.valid = mask
        self.counted = None  # each token's index among its sample's valid tokens, where padding lies inside one
        if cu_seqlens is not None:
            bounds = cu_seqlens.astype(np.int64)
            self.first, self.last = bounds[:-1], bounds[1:] - 1
        elif mask is None:
            self.first = np.arange(rows) * length
            self.last = self.first + (length - 1)
        else:
            self.first = np.arange(rows) * length + mask.argmax(1)
            self.last = np.arange(rows) * length + (length - 1) - mask[:, ::-1].argmax(1)
            if (np.count_nonzero(mask, axis=1) != self.last - self.first + 1).any():
                self.counted = (np.cumsum(mask, axis=1) - 1).reshape(-1)
        # a run opens at a token whose sample's token before it was not generated
        step = tokens if self.counted is None else self.counted[tokens]
        opens = np.ones(tokens.size, dtype=bool)
        opens[1:] = step[1:] != step[:-1] + 1
        if self.counted is not None:
            opens[1:] |= tokens[1:] // length != tokens[:-1] // length
        self.run = np.cumsum(opens) - 1
        self.start = tokens[opens]
        if self.counted is not None:
            self.prompt_tokens = self.counted[self.start]
        else:
            sample = self.start // length if cu_seqlens is None else np.searchsorted(self.first, self.start, "right") - 1
            self.prompt_tokens = self.start - self.first[sample]

    def index(self, run_delta: np.ndarray) -> np.ndarray:
        """Each generated token's index in its sample plus its run's delta."""
        if self.counted is not None:
            return self.counted[self.tokens] + run_delta[self.run]
        # (the index is the token's distance from its run's start, plus the tokens before the run)
        return self.tokens + (run_delta + self.prompt_tokens - self.start)[self.run]

    def largest_before(self, prefill: np.ndarray) -> np.ndarray:
        """For each run, the largest prefill position of its sample's tokens before it: the
        largest of each stretch between consecutive sample and run starts, in one pass over the
        positions, then the running largest of those stretches within each sample."""
        values = prefill.reshape(prefill.shape[0], -1)
        if self.counted is not None:  # what padding holds does not count (no position is below 0)
            assert self.valid is not None
            values = np.where(self.valid.reshape(1, -1), values, 0)
        # (no run starts where its sample does; samples without tokens at the end start past the positions)
        bounds = np.sort(np.concatenate((self.first[self.first < values.shape[1]], self.start)))
        stretch = np.maximum.reduceat(values, bounds, axis=1).max(0)
        sample = np.searchsorted(self.first, bounds, side="right") * _SAMPLE_SHIFT  # restarts the maximum there
        floats = stretch.dtype.kind == "f"
        if floats and stretch.dtype != np.float32:
            raise TypeError(f"fractional positions must be float32, got {stretch.dtype}")
        keys = stretch.view(np.int32).astype(np.int64) if floats else stretch.astype(np.int64)  # (ordered bits)
        running = np.maximum.accumulate(keys + sample) - sample
        before = running[np.searchsorted(bounds, self.start) - 1]  # the stretch that ends where the run starts
        return before.astype(np.int32).view(np.float32) if floats else before
