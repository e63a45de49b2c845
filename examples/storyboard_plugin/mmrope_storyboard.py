"""mmrope plugin for Storyboard, a family of its own: a board is a series of panels, each shown
for as long as the story needs (a time stamp per panel), with its narration, between two
markers; the panels of each second come first, then that second's narration.

The family's rule is written as data for mmrope's media-item primitives
(:mod:`mmrope_core.items`); no code of mmrope knows it. The definition is
:meth:`StoryboardModel.get_rope_index`, written plainly (``implementation="reference"`` binds it);
its config and models are registered with transformers' auto classes, so mmrope measures whether
it trains packed rows and its own model-level tests build it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, AutoModelForImageTextToText, ProcessorMixin
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLPreTrainedModel, Qwen2VLTextModel

from mmrope_core import ExampleCase, RopeBinding, hookimpl

PROCESSOR_CLASSES = ("StoryboardProcessor",)
TOKENS = {"board_token": "<|board|>", "board_end_token": "<|/board|>", "panel_token": "<|panel|>",
          "narration_token": "<|narration|>"}
MERGE, PATCH = 2, 14  # a panel's token: 2 x 2 patches of 14 pixels
MEL_HOP, MELS_PER_TOKEN = 160, 50  # 16 kHz samples a mel frame, mel frames a narration token: half a second
PER_SECOND = 2  # temporal positions a second: one a narration token
KEYS = {"panels": ("panel_grid_thw", "panel_times"), "narration": "narration_lengths"}
MEDIA_KEYS = ("panel_grid_thw", "panel_times", "narration_lengths")


class StoryboardConfig(Qwen2VLTextConfig):
    """A Storyboard model: a Qwen2-VL-style decoder with multimodal RoPE, the family's tokens, and
    the panels' patches as its processor cuts them."""

    model_type = "storyboard"

    def __init__(self, board_token_id: int = 2, board_end_token_id: int = 3, panel_token_id: int = 4,
                 narration_token_id: int = 5, patch_size: int = PATCH, spatial_merge_size: int = MERGE,
                 temporal_patch_size: int = 1, **kwargs: Any) -> None:
        self.board_token_id, self.board_end_token_id = board_token_id, board_end_token_id
        self.panel_token_id, self.narration_token_id = panel_token_id, narration_token_id
        self.patch_size, self.spatial_merge_size = patch_size, spatial_merge_size
        self.temporal_patch_size = temporal_patch_size
        super().__init__(**kwargs)


class StoryboardModel(Qwen2VLTextModel):
    """The family's decoder; without ``position_ids`` it computes them with :meth:`get_rope_index`.
    A panel token's embedding is its patches projected to the model's width; narration tokens are
    read as their placeholder's embedding (an example model: positions and packing are what it shows)."""

    config_class = StoryboardConfig

    def __init__(self, config: StoryboardConfig) -> None:
        super().__init__(config)
        features = 3 * config.temporal_patch_size * (config.patch_size * config.spatial_merge_size) ** 2
        self.panel_projection = torch.nn.Linear(features, config.hidden_size)

    def forward(self, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None,
                inputs_embeds: Any = None, pixel_values: Any = None, panel_grid_thw: Any = None,
                panel_times: Any = None, narration_lengths: Any = None, **kwargs: Any) -> Any:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
            if pixel_values is not None:  # a panel token's merged patches are consecutive rows
                panels = pixel_values.reshape(-1, self.panel_projection.in_features).to(inputs_embeds.dtype)
                where = (input_ids == self.config.panel_token_id)[..., None].expand_as(inputs_embeds)
                inputs_embeds = inputs_embeds.masked_scatter(where, self.panel_projection(panels))
        if position_ids is None and input_ids is not None:
            position_ids, _ = self.get_rope_index(input_ids, panel_grid_thw, panel_times, narration_lengths,
                                                  attention_mask)
        return super().forward(attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds,
                               **kwargs)

    def get_rope_index(self, input_ids: Any, panel_grid_thw: Any = None, panel_times: Any = None,
                       narration_lengths: Any = None, attention_mask: Any = None) -> tuple[Any, Any]:
        """Positions ``(3, B, L)`` (1 at padding) and each sample's delta: text and markers count
        on; a board's placeholders, whichever tokens hold them, take :func:`board_positions` from
        one past its marker; its end marker one past the board's largest position. ``panel_times``:
        each panel's time stamp, board after board."""
        config = self.config
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        positions = torch.ones(3, *input_ids.shape, dtype=torch.long, device=input_ids.device)
        deltas, board, shown = [], 0, 0
        for sample in range(input_ids.shape[0]):
            row, placed, following = input_ids[sample][mask[sample].bool()].tolist(), [], 0
            block: Iterator[tuple[int, int, int]] = iter(())
            for token in row:
                position = next(block, None)
                if position is not None:
                    placed.append(position)
                elif token == config.board_token_id:
                    placed.append((following,) * 3)
                    opened = len(placed)
                    grid = panel_grid_thw[board].tolist()
                    times = [float(time) for time in panel_times[shown : shown + grid[0]]]
                    block = iter(board_positions(grid, times, int(narration_lengths[board]), following + 1))
                    board, shown = board + 1, shown + grid[0]
                elif token == config.board_end_token_id:
                    largest = max(max(position) for position in placed[opened:])
                    placed.append((largest + 1,) * 3)
                    following = largest + 2
                else:
                    placed.append((following,) * 3)
                    following += 1
            if placed:
                positions[:, sample, mask[sample].bool()] = torch.tensor(placed, device=input_ids.device).t()
            deltas.append(max((max(position) for position in placed), default=-1) + 1 - len(row))
        return positions, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


class StoryboardForConditionalGeneration(Qwen2VLPreTrainedModel):
    """:class:`StoryboardModel` with a language-model head: logits, and the loss given ``labels``."""

    config_class = StoryboardConfig

    def __init__(self, config: StoryboardConfig) -> None:
        super().__init__(config)
        self.model = StoryboardModel(config)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> CausalLMOutputWithPast:
        outputs = self.model(input_ids=input_ids, **kwargs)
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None if labels is None else self.loss_function(logits, labels, self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


AutoConfig.register("storyboard", StoryboardConfig, exist_ok=True)
AutoModel.register(StoryboardConfig, StoryboardModel, exist_ok=True)
AutoModelForImageTextToText.register(StoryboardConfig, StoryboardForConditionalGeneration, exist_ok=True)


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


# -- the family's processor, and a tiny one built offline for `mmrope check` and the tests --------

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


class StoryboardProcessor(ProcessorMixin):
    """Text with a ``<|board|>`` where each board goes; a board is its panels (``(H, W, 3)``
    arrays of one size), the seconds each is shown (one number a panel), and its narration
    (16 kHz samples). Each panel's time stamp is the seconds shown before it in its board
    (``panel_times``, board after board). A batch of texts is padded on ``padding_side``
    (default the tokenizer's)."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None, **kwargs: Any) -> None:
        super().__init__(image_processor, tokenizer, **kwargs)

    def __call__(self, text: list[str], boards: list[tuple[list[Any], Sequence[float], Any]] | None = None,
                 return_tensors: str = "pt", **kwargs: Any) -> Any:
        import numpy as np
        from transformers import BatchFeature

        from mmrope_core.tiny import padded_batch

        start, end, panel, narration = self.tokenizer.convert_tokens_to_ids(list(TOKENS.values()))
        grids, times, mels, pixels, rows = [], [], [], [], []
        pending = iter(boards or ())
        for line in text:
            pieces = line.split(TOKENS["board_token"])
            row = self.tokenizer(pieces[0], add_special_tokens=False)["input_ids"]
            for piece in pieces[1:]:
                board = next(pending, None)
                if board is None:
                    raise ValueError(f"the texts hold more {TOKENS['board_token']} markers than the {len(boards or ())} "
                                     f"boards given; give one board a marker")
                panels, shown, waveform = board
                seconds = np.asarray(shown, dtype=np.float64).reshape(-1)
                if len(seconds) != len(panels) or not (np.isfinite(seconds).all() and (seconds >= 0).all()):
                    raise ValueError(f"a board shows each of its {len(panels)} panels for some seconds, one finite "
                                     f"number from 0 a panel; got {seconds.tolist()}")
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
        side = kwargs.get("padding_side", self.tokenizer.padding_side)
        ids, mask = padded_batch(rows, self.tokenizer.pad_token_id, left=side == "left")
        data: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if grids:
            data.update(pixel_values=torch.cat(pixels), panel_grid_thw=torch.tensor(grids),
                        panel_times=torch.tensor(times, dtype=torch.float32),
                        narration_lengths=torch.tensor(mels))
        return BatchFeature(data, tensor_type=return_tensors)


def build() -> tuple[Any, Any]:
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
