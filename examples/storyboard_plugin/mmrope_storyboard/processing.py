"""Storyboard's processor, and a tiny one with its config built offline for ``mmrope check`` and
the tests. Importing this module imports :mod:`mmrope_storyboard.modeling`, which registers the
family with transformers' auto classes."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import BatchFeature, ProcessorMixin

from mmrope_core import InvalidInputError, UnknownKeywordError
from mmrope_core.tiny import padded_batch

from . import MEL_HOP, MERGE, PATCH, TOKENS, board_tokens
from .modeling import StoryboardConfig

#: the keyword arguments of :meth:`StoryboardProcessor.__call__` beside its named ones
OPTIONS = ("padding", "padding_side")


class StoryboardProcessor(ProcessorMixin):
    """Text with a ``<|board|>`` where each board goes; a board is its panels (``(H, W, 3)``
    arrays of one size), the seconds each is shown (one number a panel), and its narration
    (16 kHz samples). Each panel's time stamp is the seconds shown before it in its board
    (``panel_times``, board after board). A batch of texts is padded to its longest
    (``padding=True``, the default, or ``"longest"``) on ``padding_side`` (``"left"`` or
    ``"right"``, default the tokenizer's)."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, **kwargs: Any) -> None:
        super().__init__(image_processor, tokenizer, **kwargs)

    def __call__(self, text: str | list[str], boards: list[tuple[list[Any], Sequence[float], Any]] | None = None,
                 return_tensors: str = "pt", **kwargs: Any) -> Any:
        pads, side = self._padding(kwargs)
        if not isinstance(text, (str, list, tuple)):
            raise InvalidInputError(f"text is a {type(text).__name__}: give a string or a list of strings")
        texts = [text] if isinstance(text, str) else list(text)  # one text, as transformers' processors take it
        boards = list(boards or ())
        _check_markers(texts, len(boards))
        start, end, panel, narration = self.tokenizer.convert_tokens_to_ids(list(TOKENS.values()))
        grids, times, mels, pixels, rows = [], [], [], [], []
        pending = iter(enumerate(boards))
        for index, line in enumerate(texts):
            pieces = line.split(TOKENS["board_token"])
            row = self.tokenizer(pieces[0], add_special_tokens=False)["input_ids"]
            for piece in pieces[1:]:
                number, board = next(pending)
                where = f"text {index}, board {number}"
                if not (isinstance(board, (tuple, list)) and len(board) == 3):
                    raise InvalidInputError(f"{where}: a board is a (panels, seconds each is shown, narration "
                                            f"waveform) triple, got a {type(board).__name__}")
                panels, shown, waveform = board
                seconds = np.asarray(shown, dtype=np.float64).reshape(-1)
                if not len(panels) or len(seconds) != len(panels) or not (np.isfinite(seconds).all()
                                                                           and (seconds >= 0).all()):
                    raise InvalidInputError(f"{where}: a board shows each of its {len(panels)} panels for some "
                                            f"seconds, one finite number from 0 a panel and at least one panel; got "
                                            f"{seconds.tolist()}")
                _check_one_size(panels, where)
                images = self.image_processor(images=list(panels), return_tensors="pt")
                _, height, width = images["image_grid_thw"][0].tolist()
                grids.append((len(panels), height, width))
                stamps = np.concatenate([[0.0], np.cumsum(seconds)[:-1]]).astype(np.float32).tolist()
                times += stamps
                mels.append(max(1, len(waveform) // MEL_HOP))
                pixels.append(images["pixel_values"])
                row += [start, *board_tokens(grids[-1], stamps, mels[-1], panel, narration), end]
                row += self.tokenizer(piece, add_special_tokens=False)["input_ids"]
            rows.append(row)
        if not pads and len({len(row) for row in rows}) > 1:
            raise InvalidInputError(f"padding={kwargs['padding']!r}, but the texts are of {len({len(row) for row in rows})} "
                                    f"lengths in tokens: pass padding=True to pad them to the longest")
        ids, mask = padded_batch(rows, self.tokenizer.pad_token_id, left=side == "left")
        data: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if grids:
            data.update(pixel_values=torch.cat(pixels), panel_grid_thw=torch.tensor(grids),
                        panel_times=torch.tensor(times, dtype=torch.float32),
                        narration_lengths=torch.tensor(mels))
        return BatchFeature(data, tensor_type=return_tensors)

    def _padding(self, options: dict[str, Any]) -> tuple[bool, str]:
        """Whether to pad the texts to the longest, and on which side."""
        for name in options:
            if name not in OPTIONS:
                meant = difflib.get_close_matches(name, ["text", "boards", "return_tensors", *OPTIONS], n=1)
                hint = f"did you mean {meant[0]!r}? " if meant else ""
                raise UnknownKeywordError(f"StoryboardProcessor() got an unknown keyword argument {name!r}; {hint}"
                                          f"It takes text, boards, return_tensors, padding and padding_side")
        pads = options.get("padding", True)
        if pads not in (True, False, "longest", "do_not_pad"):
            raise InvalidInputError(f"padding={pads!r}: the texts are padded to the longest (True or 'longest') or "
                                    f"not at all (False or 'do_not_pad')")
        side = options.get("padding_side", self.tokenizer.padding_side)
        if side not in ("left", "right"):
            raise InvalidInputError(f"padding_side={side!r}: pad the texts on 'left' or 'right'")
        return pads in (True, "longest"), str(side)


def _check_markers(texts: list[Any], given: int) -> None:
    """Refuse texts that are not strings, and a count of boards other than the texts' markers."""
    marker = TOKENS["board_token"]
    for index, line in enumerate(texts):
        if not isinstance(line, str):
            raise InvalidInputError(f"text {index} is a {type(line).__name__}, not a string: give text as a string "
                                    f"or a list of strings")
    counts = [line.count(marker) for line in texts]
    if sum(counts) > given:
        index = next(index for index in range(len(texts)) if sum(counts[: index + 1]) > given)
        raise InvalidInputError(f"text {index} holds a {marker} marker with no board: the texts hold {sum(counts)} "
                                f"markers and {given} boards are given; give one board a marker, in the markers' order")
    if sum(counts) < given:
        raise InvalidInputError(f"{given} boards are given for the texts' {sum(counts)} {marker} markers: boards "
                                f"{sum(counts)} to {given - 1} have none (the last text is text {len(texts) - 1}); "
                                f"put a {marker} in the text where each board goes, or give fewer boards")


def _check_one_size(panels: Sequence[Any], where: str) -> None:
    """Refuse a board whose panels differ in size: the board is one grid, cut as its first panel."""
    sizes = [np.shape(panel) for panel in panels]
    for number, size in enumerate(sizes):
        if size != sizes[0]:
            raise InvalidInputError(f"{where}: panel {number} is {size}, panel 0 {sizes[0]}; a board's panels are one "
                                    f"grid: resize them to one size, or make a board of each size")


def tiny_processor_and_config() -> tuple[StoryboardProcessor, StoryboardConfig]:
    """A processor (Qwen2-VL's image processor, a word-level tokenizer) and a small config."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer(TOKENS)
    images = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=1,
                                      min_pixels=(PATCH * MERGE) ** 2, max_pixels=(PATCH * MERGE * 4) ** 2)
    start, end, panel, narration = tokenizer.convert_tokens_to_ids(list(TOKENS.values()))
    config = StoryboardConfig(start, end, panel, narration, vocab_size=len(tokenizer), hidden_size=64,
                              intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, attn_implementation="sdpa", bos_token_id=None,
                              eos_token_id=None, pad_token_id=tokenizer.pad_token_id,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "mrope_section": [2, 3, 3]})
    return StoryboardProcessor(images, tokenizer), config
