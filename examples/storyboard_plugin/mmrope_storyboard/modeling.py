"""Storyboard's config and models, registered with transformers' ``AutoConfig``, ``AutoModel`` and
``AutoModelForImageTextToText`` when this module is imported: import it before loading a
checkpoint of the family (``AutoModelForImageTextToText.from_pretrained``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, AutoModelForImageTextToText
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLPreTrainedModel, Qwen2VLTextModel

from . import MERGE, PATCH, board_positions


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
