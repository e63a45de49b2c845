"""The compiled CPU loops a plugin may call, and whether they are loaded.

The loops are missing where mmrope-core was installed without a C compiler (or the Python
headers), and switched off by ``MMROPE_DISABLE_COMPILED=1``: :func:`available` is then False and
a caller takes its own numpy/torch path, which must give the same results. Both functions read
``native`` (the loops, or None) when called, so replacing it switches the loops for their callers.
"""

from __future__ import annotations

import numpy as np

from ._compiled import DISABLE_VARIABLE, native

__all__ = [
    "DISABLE_VARIABLE",
    "OMNI_BAD_MEDIA",
    "OMNI_EMPTY_SAMPLE",
    "OMNI_MISMATCH",
    "OMNI_PADDING_INSIDE",
    "OMNI_WRITTEN",
    "available",
    "omni_positions",
]

#: What :func:`omni_positions` returns: the positions are written, or why they are not.
OMNI_WRITTEN, OMNI_MISMATCH, OMNI_PADDING_INSIDE, OMNI_BAD_MEDIA, OMNI_EMPTY_SAMPLE = range(5)


def available() -> bool:
    """Whether the compiled loops are loaded."""
    return native is not None


def omni_positions(out: np.ndarray, text_row: bool, batch: int, length: int, ids: np.ndarray,
                   mask: np.ndarray | None, first: np.ndarray | None, count: np.ndarray | None,
                   tokens: tuple[int, int, int, int, int, int, int], flags: tuple[bool, bool, bool, bool],
                   sizes: tuple[int, int, int], per_second: float, image_grid: np.ndarray | None,
                   video_grid: np.ndarray | None, seconds: np.ndarray | None, audio_frames: np.ndarray | None,
                   deltas: np.ndarray, threads: int) -> int:
    """An Omni thinker's positions for a batch, in one read of its tokens and one write.

    Arrays are C-contiguous numpy arrays on the host.

    Args:
        out: written: float32 for Qwen3-Omni in the transformers convention, else int64;
            ``(3, B, L)``, or ``(B, 4, L)`` with ``text_row``, whose row 0 counts each sample's
            tokens from 0 and holds 1 at padding.
        batch, length: ``B`` and ``L``.
        ids: int64 ``(B, L)`` token ids.
        mask: bool ``(B, L)``, one sample per row, its valid tokens; None: every token.
        first, count: int64 ``(K,)`` samples lying back to back over the rows (packed rows), by
            the flat index of their first token and their token count; both None for one sample
            per row.
        tokens: the ids of (image, video, audio, vision start, vision end, audio start, audio end).
        flags: (Qwen3-Omni, else Qwen2.5-Omni; ``use_audio_in_video``; text only: no image or
            video grid given; vLLM 0.33's positions, else transformers').
        sizes: (spatial merge size, temporal positions per audio-in-video chunk (Qwen2.5-Omni),
            mel frames per audio encoder window half, ``n_window`` (Qwen3-Omni)).
        per_second: temporal positions per second of video.
        image_grid, video_grid: int64 ``(N, 3)`` grids in the batch's order, or None.
        seconds: float32 seconds per grid of each video (needed with videos); values that are not
            finite, negative or above 2**20 (temporal ids would not fit int64) give OMNI_BAD_MEDIA.
        audio_frames: int64 mel frames of each audio in the batch's order, or None.
        deltas: written: each sample's largest position + 1 - its token count, in ``out``'s dtype.
        threads: at most this many threads share the write.

    Returns:
        :data:`OMNI_WRITTEN`; else ``out`` and ``deltas`` hold nothing to read and the status
        says why:
        :data:`OMNI_MISMATCH` where tokens and media disagree (also where vLLM refuses the
        request: an audio of its own beside a video with its audio in one sample),
        :data:`OMNI_PADDING_INSIDE` for a mask with padding between a row's valid tokens (compact
        the rows and call again), :data:`OMNI_BAD_MEDIA` for media that cannot be placed,
        :data:`OMNI_EMPTY_SAMPLE` for a sample without tokens.

    Raises:
        ValueError: arrays whose sizes do not fit the batch, or samples that do not cover it
            back to back.
        RuntimeError: the compiled loops are not loaded.
    """
    if native is None:
        raise RuntimeError(f"mmrope's compiled loops are not loaded (see mmrope_core.compiled.available; "
                           f"{DISABLE_VARIABLE}=1 switches them off)")
    status: int = native.omni_positions(out, text_row, batch, length, ids, mask, first, count, tokens, flags, sizes,
                                        per_second, image_grid, video_grid, seconds, audio_frames, deltas, threads)
    return status
