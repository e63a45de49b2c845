"""mmrope plugin for Storyboard, a family of its own: a board is a series of panels, each shown
for as long as the story needs (a time stamp per panel), with its narration, between two
markers; the panels of each second come first, then that second's narration.

The family's rule is written as data for mmrope's media-item primitives
(:mod:`mmrope_core.items`); no code of mmrope knows it. The definition is
:meth:`mmrope_storyboard.modeling.StoryboardModel.get_rope_index`, written plainly
(``implementation="reference"`` binds it). This module holds the hooks and imports neither torch
nor transformers, so discovering the plugin is cheap; :mod:`mmrope_storyboard.modeling` (the
config and models, registered with transformers' auto classes when it is imported) and
:mod:`mmrope_storyboard.processing` (the processor) are imported inside the hooks that need them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from mmrope_core import ExampleCase, RopeBinding, hookimpl

PROCESSOR_CLASSES = ("StoryboardProcessor",)
TOKENS = {"board_token": "<|board|>", "board_end_token": "<|/board|>", "panel_token": "<|panel|>",
          "narration_token": "<|narration|>"}
MERGE, PATCH = 2, 14  # a panel's token: 2 x 2 patches of 14 pixels
MEL_HOP, MELS_PER_TOKEN = 160, 50  # 16 kHz samples a mel frame, mel frames a narration token: half a second
PER_SECOND = 2  # temporal positions a second: one a narration token
KEYS = {"panels": ("panel_grid_thw", "panel_times"), "narration": "narration_lengths"}
MEDIA_KEYS = ("panel_grid_thw", "panel_times", "narration_lengths")


def layout(processor: Any) -> Any:
    """Storyboard's rule as an :class:`~mmrope_core.items.ItemLayout`."""
    from mmrope_core.items import GridMedia, ItemKind, ItemLayout, SequenceMedia, TemporalRule

    start, end, panel, narration = processor.tokenizer.convert_tokens_to_ids(list(TOKENS.values()))
    # grouped by second: panels whose temporal id // 2 agree, then the next two narration tokens
    board = ItemKind("board", key=(start,), media=("panels", "narration"), placeholders=(panel, narration),
                     closing=(end,), interleave="groups", chunk=PER_SECOND)
    return ItemLayout(media=(GridMedia("panels", MERGE, stamped=True),
                             SequenceMedia("narration", steps=((1, MELS_PER_TOKEN),))),
                      kinds=(board,), temporal=TemporalRule(float(PER_SECOND), "scale_first", "float64"), padding=1)


@hookimpl
def bind_rope_index(processor: Any, config: Any, options: Any) -> RopeBinding | None:
    if type(processor).__name__ not in PROCESSOR_CLASSES:
        return None
    from mmrope_core import InvalidInputError
    from mmrope_core.items import ItemKernel

    kernel = ItemKernel(layout(processor), KEYS)
    implementation = options.get("implementation", "fast")
    if implementation == "fast":
        return RopeBinding("mrope", kernel, "fast", "Storyboard, media-item kernel")
    if implementation != "reference":
        raise InvalidInputError(f"implementation={implementation!r} is not an implementation of Storyboard; use "
                                f"'fast' or 'reference'")
    from mmrope_core.reference import ReferenceKernel

    def check(input_ids: Any, attention_mask: Any = None, **inputs: Any) -> None:
        kernel.rope_index(input_ids, attention_mask, **inputs)  # the kernel's typed refusals, then the model's positions

    from .modeling import StoryboardConfig, StoryboardModel

    config = config or StoryboardConfig(*processor.tokenizer.convert_tokens_to_ids(list(TOKENS.values())))
    return RopeBinding("mrope", ReferenceKernel(StoryboardModel, config, check=check), "reference",
                       "Storyboard, its model's own get_rope_index")


@hookimpl
def get_rope_index_kwargs(processor: Any, multi_modal_inputs: Any) -> dict[str, Any] | None:
    if type(processor).__name__ not in PROCESSOR_CLASSES:
        return None
    return {key: multi_modal_inputs[key] for key in MEDIA_KEYS if multi_modal_inputs.get(key) is not None}


@hookimpl
def batch_layout(processor: Any) -> Any:
    if type(processor).__name__ not in PROCESSOR_CLASSES:
        return None
    from mmrope_core.batching import VIDEO_GRID, BatchLayout, MediaKey

    # a board's panels are a video's frames: one grid a board, one time stamp a panel
    return BatchLayout(media={"panel_grid_thw": VIDEO_GRID,
                              "panel_times": MediaKey(role="stamps", grid="panel_grid_thw"),
                              "narration_lengths": MediaKey(role="audio_lengths")})


@hookimpl
def varlen_keys(processor: Any) -> set[str] | None:
    return set() if type(processor).__name__ in PROCESSOR_CLASSES else None


@hookimpl
def example_cases() -> list[ExampleCase]:
    return [ExampleCase("Storyboard", build, board_samples, board_batch)]


# -- the layout of a board's placeholders, and the tiny processor and samples of `mmrope check` ----

def board_tokens(grid: Sequence[int], times: Sequence[float], mels: int, panel: int, narration: int) -> list[int]:
    """A board's placeholders as the model reads them: each second's panels, then its narration."""
    per_panel = grid[1] * grid[2] // MERGE**2
    said, total, tokens = 0, (mels - 1) // MELS_PER_TOKEN + 1, []
    groups = [int(time * PER_SECOND) // PER_SECOND for time in times]
    for index in range(grid[0]):
        tokens += [panel] * per_panel
        if index + 1 == grid[0] or groups[index + 1] != groups[index]:
            taken = min(total - said, PER_SECOND)
            tokens += [narration] * taken
            said += taken
    return tokens + [narration] * (total - said)


def board_positions(grid: Sequence[int], times: Sequence[float], mels: int, start: int) -> list[tuple[int, int, int]]:
    """A board's placeholders' positions in the order :func:`board_tokens` lays them out: panel
    ``f``'s tokens at ``(start + trunc(times[f] * 2), start + line, start + column)``,
    narration token ``i`` at ``start + i``."""
    lines, columns = grid[1] // MERGE, grid[2] // MERGE
    panels = iter([(start + int(time * PER_SECOND), start + line, start + column)
                   for time in times for line in range(lines) for column in range(columns)])
    narration = itertools.count(start)
    return [next(panels) if token == 0 else (next(narration),) * 3 for token in board_tokens(grid, times, mels, 0, 1)]


def build() -> tuple[Any, Any]:
    """A processor (Qwen2-VL's image processor, a word-level tokenizer) and a small config; the
    config's model is registered with transformers' auto classes from then on."""
    from .processing import tiny_processor_and_config

    return tiny_processor_and_config()


def board_samples(processor: Any, rng: Any) -> list[dict[str, Any]]:
    """Two samples of text and boards of random size, pace and narration."""
    import numpy as np

    from mmrope_core.tiny import filler_text

    samples = []
    for count in (2, 1):
        boards = []
        for _ in range(count):
            side = (28 * rng.randint(1, 3), 28 * rng.randint(1, 3))
            panels = [np.full((*side, 3), 255 * index // 5, np.uint8) for index in range(rng.randint(1, 5))]
            shown = [rng.choice((0.0, 0.25, 0.5, 1.0, 1.5, 3.0)) for _ in panels]
            boards.append((panels, shown, np.zeros(rng.randint(MEL_HOP, 4 * 16000), np.float32)))
        text = " ".join([filler_text(rng, 3)] + [f"{TOKENS['board_token']} {filler_text(rng, 2)}" for _ in boards])
        samples.append({"text": [text], "boards": boards, "return_tensors": "pt"})
    return samples


def board_batch(processor: Any, config: Any, rng: Any) -> dict[str, Any]:
    """One sample of text and up to three boards of random grids, panels' times and narration,
    laid out as the processor lays it out: ``input_ids``, ``attention_mask`` and the media keys."""
    import numpy as np
    import torch

    from mmrope_core.tiny import filler_text

    start, end, panel, narration = processor.tokenizer.convert_tokens_to_ids(list(TOKENS.values()))

    def text(least: int = 0) -> list[int]:
        return processor.tokenizer(filler_text(rng, rng.randint(least, 4)), add_special_tokens=False)["input_ids"]

    row, boards = text(least=1), []
    for _ in range(rng.randint(0, 3)):
        grid = (rng.randint(1, 6), MERGE * rng.randint(1, 3), MERGE * rng.randint(1, 3))
        shown = [rng.choice((0.0, 0.25, 0.5, 1.0, 2 / 3, 1.3, rng.uniform(0.1, 3))) for _ in range(grid[0] - 1)]
        times = np.concatenate([[0.0], np.cumsum(shown)]).astype(np.float32).tolist()
        mels = rng.randint(1, 12 * MELS_PER_TOKEN)
        boards.append((grid, times, mels))
        row += [start, *board_tokens(grid, times, mels, panel, narration), end, *text()]
    ids = torch.tensor([row])
    batch: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if boards:
        batch.update(panel_grid_thw=torch.tensor([grid for grid, _, _ in boards]),
                     panel_times=torch.tensor([time for _, times, _ in boards for time in times], dtype=torch.float32),
                     narration_lengths=torch.tensor([mels for _, _, mels in boards]))
    return batch
