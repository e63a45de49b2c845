"""Positions from matched runs.

On the CPU a compiled loop writes them from the runs: each sample's tokens in order, once per
row of the output. On other devices, three counter rows (four with the text row), the steps
they take where positions do not simply count on (a few per run and one per grid line, worked
out in numpy) and one cumsum, in torch passes over the batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..compiled import native
from ._runs import Runs, Spans


@dataclasses.dataclass(slots=True)  # not frozen: built on every call (see _runs.Runs)
class RunLayout:
    """The media runs in position space, assuming each sample's valid tokens form one span."""

    pos: np.ndarray  # position of the run's first token
    end: np.ndarray  # (3, R): position of its last token
    text_after: np.ndarray  # position of a text token right after it
    largest: np.ndarray  # its largest position on any axis
    height: np.ndarray  # grid lines per frame, after merging
    width: np.ndarray  # tokens per grid line
    frames: np.ndarray
    first: np.ndarray  # flat index of the first valid token of the run's sample
    last: np.ndarray  # and of its last
    sample_end: np.ndarray  # (B,): a sample's last position, were its last token text
    scaled: list[tuple[np.ndarray | slice, np.ndarray | torch.Tensor]]

    @classmethod
    def of(cls, runs: Runs, grid: np.ndarray, scaled, spans: Spans, merge: int,
           resume_past_frames: bool = False) -> RunLayout:
        frames = grid[:, 0]
        height, width = grid[:, 1] // merge, grid[:, 2] // merge
        last_frame = frames - 1
        for kind_runs, scale in scaled:
            last_frame[kind_runs] = _temporal(last_frame[kind_runs], scale)
        extent = np.maximum(height, width)  # the text after a run continues max(h, w) after its start
        if resume_past_frames:  # or past its last frame, where that is further (a rollout engine's rule)
            extent = np.maximum(extent, last_frame + 1)
        first, last = spans.first[runs.row], spans.last[runs.row]
        gain = extent - runs.length
        gained = np.bincount(runs.row, weights=gain, minlength=spans.count.size).astype(np.int64)
        earlier = np.add.accumulate(gain) - gain - (np.add.accumulate(gained) - gained)[runs.row]
        pos = runs.start - first + earlier
        end = np.array((last_frame, height - 1, width - 1)) + pos
        largest = pos + np.maximum(last_frame, extent - 1)
        sample_end = spans.count + gained - 1
        return cls(pos, end, pos + extent, largest, height, width, frames, first, last, sample_end, scaled)


def write(code: torch.Tensor, mask: torch.Tensor | None, runs: Runs, spans: Spans, grid: np.ndarray, scaled,
          merge: int, *, text_row: bool = False, resume_past_frames: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positions ``(3, B, L)`` and deltas ``(B, 1)``; with ``text_row``, positions ``(B, 4, L)``
    whose row 0 counts each sample's valid tokens from 0 (1 at padding), and no deltas. On the
    CPU they are written from the runs (:func:`written_from_runs`), on other devices by torch
    passes over the batch (:func:`counted_on`)."""
    if code.device.type == "cpu" and native is not None:
        return written_from_runs(runs, spans, grid, scaled, merge, (code.shape[0], code.shape[1]), text_row=text_row,
                                 resume_past_frames=resume_past_frames)
    return counted_on(code, mask, runs, spans, grid, scaled, merge, text_row=text_row,
                      resume_past_frames=resume_past_frames)


def written_from_runs(runs: Runs, spans: Spans, grid: np.ndarray, scaled, merge: int, shape: tuple[int, int], *,
                      text_row: bool = False, resume_past_frames: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`write` on the CPU: a compiled loop writes each sample's tokens in order, text
    counting on, each media run on its grid, once per row of the output."""
    batch, length = shape
    frames = np.ascontiguousarray(grid[:, 0])
    out = torch.empty((batch, 4, length) if text_row else (3, batch, length), dtype=torch.int64)
    deltas = None if text_row else np.empty(spans.count.size, dtype=np.int64)
    assert native is not None  # write() takes counted_on without it
    native.positions(out.numpy(), batch, length, text_row, spans.first, spans.count, runs.start, runs.length,
                      runs.row, grid[:, 1] // merge, grid[:, 2] // merge, frames, _temporal_ids(frames, scaled),
                      deltas, torch.get_num_threads(), resume_past_frames)
    return out, None if deltas is None else torch.from_numpy(deltas[:, None])


def _temporal_ids(frames: np.ndarray, scaled) -> np.ndarray:
    """Each run's frames' temporal ids, run after run: the frame number, or for scaled runs
    ``trunc(frame * scale)`` (see :func:`_temporal`)."""
    run_of_frame = np.arange(frames.size).repeat(frames)
    ids = np.arange(run_of_frame.size) - (np.add.accumulate(frames) - frames)[run_of_frame]
    for kind_runs, scale in scaled:
        scale_of_run = np.full(frames.size, -1)
        scale_of_run[kind_runs] = np.arange(len(scale))
        frame_scale = scale_of_run[run_of_frame]
        selected = (frame_scale >= 0).nonzero()[0]
        ids[selected] = _temporal(ids[selected], scale[frame_scale[selected]])
    return ids


def counted_on(code: torch.Tensor, mask: torch.Tensor | None, runs: Runs, spans: Spans, grid: np.ndarray, scaled,
               merge: int, *, text_row: bool = False,
               resume_past_frames: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`write` in torch passes over the batch, for devices other than the CPU. Each row of
    the positions is the cumsum of a counter: 1 at every valid text token (in the width row and
    the text row, at every valid media token too), 0 at padding, overwritten by the step to take
    at the few tokens where positions do not simply count on (see :func:`_steps`)."""
    batch, length = code.shape
    device = code.device
    layout = RunLayout.of(runs, grid, scaled, spans, merge, resume_past_frames)
    index, steps = _steps(runs, layout, spans, length, text_row)
    out = torch.empty((batch, 4, length) if text_row else (3, batch, length), dtype=torch.int64, device=device)
    _count_on(out, code, mask, index, steps, text_row)
    if text_row:
        return out, None
    row_max = layout.sample_end.copy()
    np.maximum.at(row_max, runs.row, layout.largest)
    return out, _tensor((row_max + 1 - spans.count)[:, None], device)


def _count_on(out: torch.Tensor, code: torch.Tensor, mask: torch.Tensor | None, index: np.ndarray,
              steps: np.ndarray, text_row: bool) -> None:
    """:func:`write`'s rows in torch passes over the whole batch (counters, steps, one cumsum), for
    devices other than the CPU."""
    batch, length = code.shape
    counters = out.transpose(0, 1) if text_row else out  # (rows, B, L)
    # the rows counting valid tokens (width, and the text row) and those counting valid text tokens
    counting_valid, counting_text = (counters[::3], counters[1:3]) if text_row else (counters[2:], counters[:2])
    if mask is None:
        counting_valid.fill_(1)
    else:
        counting_valid.copy_(mask.view(torch.int8))
    # 0 only at valid text (the code is -1 at padding); torch's logical_not is many times faster than == 0
    counting_text.copy_(code.logical_not().view(torch.int8))
    if text_row:  # (B, 4, L): each sample's rows follow one another
        flat_index = index + (index // length) * (3 * length) + np.arange(4)[:, None] * length
    else:
        flat_index = index + np.arange(3)[:, None] * (batch * length)
    # a run starting a sample repeats that sample's first step, with the same value
    out.view(-1).scatter_(0, _tensor(flat_index.ravel(), out.device), _tensor(steps.ravel(), out.device))
    out.cumsum_(-1)


def _steps(runs: Runs, layout: RunLayout, spans: Spans, length: int,
           text_row: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Where the counter rows do not count on: flat indices ``(E,)`` (``row * L + column``) and
    the ``(3, E)`` step to take there, the difference between a token's position and the token's
    before it; with ``text_row``, ``(4, E)`` steps, the text row's first (see :func:`_text_row`).

    - a sample's first valid token: 0 (positions start at 0), or, for a packed sample that
      begins where the previous one ended inside a row, back to 0 from the previous one's end;
    - a run's first token: 1 after text, the sample's first step at its start, from the end of a
      run of the same sample it touches;
    - every further line of a grid: back to the line's first column, on to the next line (or back
      to the first line and on to the frame's temporal id);
    - the token after a run, when text: on to ``max(h, w)`` past the run's start;
    - the token after a sample's last valid token, when the row goes on: back to 0.
    """
    after = runs.start + runs.length
    touches = after[:-1] == runs.start[1:]  # run r + 1 begins right where run r ends
    after_step = layout.text_after - layout.end
    start_step = np.ones((3, runs.count), dtype=np.int64)
    np.copyto(start_step[:, 1:], after_step[:, :-1], where=touches)
    at_first = runs.start == layout.first
    after_applies = after <= layout.last
    after_applies[:-1] &= ~touches
    # back to 0 after the sample's last token: from the end of the run it ends with, or its text
    ending = np.empty((3, spans.count.size), dtype=np.int64)
    ending[:] = layout.sample_end
    ended = after - 1 == layout.last
    ending[:, runs.row[ended]] = layout.end[:, ended]
    started = spans.count > 0
    tail = spans.last + 1
    tail_applies = (tail % length != 0) & started
    first_step = np.zeros((3, spans.count.size), dtype=np.int64)
    # packed samples: one that begins where the previous one ended, inside a row, takes the
    # previous one's step back to 0 as its first step
    follows = ((spans.first[1:] == tail[:-1]) & tail_applies[:-1]).nonzero()[0] + 1
    if follows.size:
        first_step[:, follows] = -ending[:, follows - 1]
        tail_applies[follows - 1] = False
    start_step[:, at_first] = first_step[:, runs.row[at_first]]
    line_index, line_step = _line_steps(runs, layout)
    index = np.concatenate((spans.first[started], runs.start, line_index, after[after_applies], tail[tail_applies]))
    steps = np.concatenate((
        first_step[:, started],
        start_step,
        line_step,
        after_step[:, after_applies],
        -ending[:, tail_applies],
    ), axis=1)
    if text_row:
        return _text_row(index, steps, runs, spans, length, started, tail_applies, at_first, follows)
    return index, steps


def _text_row(index, steps, runs, spans, length, started, tail_applies, at_first,
              follows) -> tuple[np.ndarray, np.ndarray]:
    """The steps with the text row's added on top: 0, 1, ... over a sample's valid tokens and 1
    at padding. Its counter is 1 at every valid token; it steps otherwise into a sample's first
    token (to 0: by 0 at a row's start, by -1 from padding, back from the previous sample's last
    count for a packed sample that follows it), after the sample's last (back to 1) and at the
    start of a row that begins with padding (to 1, where the other rows step by 0)."""
    inside = spans.first % length != 0
    into_first = -inside.astype(np.int64)
    if follows.size:
        into_first[follows] = 1 - spans.count[follows - 1]
        inside[follows] = False  # what precedes it is a sample, not padding
    text = np.ones(index.size, dtype=np.int64)
    leading = np.count_nonzero(started)
    text[:leading] = into_first[started]
    starting = at_first.nonzero()[0]  # a run that starts a sample
    text[leading + starting] = into_first[runs.row[starting]]
    tails = int(tail_applies.sum())
    text[index.size - tails :] = 2 - spans.count[tail_applies]
    padded = inside | ~started
    row_start = spans.first[padded] // length * length
    index = np.concatenate((index, row_start))
    steps = np.concatenate((text[None], steps), axis=0)
    padded_steps = np.zeros((4, row_start.size), dtype=np.int64)
    padded_steps[0] = 1
    return index, np.concatenate((steps, padded_steps), axis=1)


def _line_steps(runs: Runs, layout: RunLayout) -> tuple[np.ndarray, np.ndarray]:
    """The first token of every grid line but a run's first, and the ``(3, N)`` step into it."""
    further = layout.frames * layout.height - 1
    first_frame = np.add.accumulate(layout.frames) - layout.frames  # of each run, among all runs' frames
    per_run = np.array((np.add.accumulate(further) - further, layout.height, layout.width, runs.start, first_frame))
    first_line, height, width, start, frames_before = per_run.repeat(further, axis=1)
    line = np.arange(1, first_line.size + 1) - first_line
    frame = line // height
    new_frame = line == frame * height
    temporal = np.zeros(line.size, dtype=np.int64)  # a frame's first line steps on to its temporal id
    ids, entered = _temporal_ids(layout.frames, layout.scaled), (frames_before + frame)[new_frame]
    temporal[new_frame] = ids[entered] - ids[entered - 1]
    steps = np.array((temporal, 1 - new_frame * height, 1 - width))
    return start + line * width, steps


def _temporal(frames: np.ndarray, scale: np.ndarray | torch.Tensor) -> np.ndarray:
    """Temporal ids of frame numbers as the reference computes them: int64 frame numbers times
    the scale in the dtype torch promotes them to, truncated; a ``(n, 2)`` scale (the
    ``seconds_first`` rule) multiplies by its columns in turn. Scales numpy holds (float32,
    float64, integers) are multiplied there, in the same dtype, so they round alike; others
    (half precision) in torch."""
    if isinstance(scale, np.ndarray):  # already in that dtype
        if scale.ndim == 2:
            return (frames.astype(scale.dtype) * scale[:, 0] * scale[:, 1]).astype(np.int64)
        return (frames.astype(scale.dtype) * scale).astype(np.int64)
    frame_numbers = torch.from_numpy(np.ascontiguousarray(frames))
    if scale.dim() == 2:
        return (frame_numbers * scale[:, 0] * scale[:, 1]).long().numpy()
    return (frame_numbers * scale).long().numpy()


def _tensor(values: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(values).to(device)
