"""A trainer's padded batch computed row by row, each row as its sample alone, where the model
numbers media across the batch: the batch's arguments are shared out among the rows by the
medium each key's plugin declares it holds one entry of each, whatever the key is named."""

import pytest
import torch

from mmrope_core import CollateError, PluginManager, RopeBinding, RopeEngine, hookimpl
from mmrope_core.batching import BatchLayout, MediaKey
from mmrope_core.integrations._rows import each_row_alone
from mmrope_core.reference import ReferenceKernel

pytest.importorskip("transformers")
qwen_vl_examples = pytest.importorskip("mmrope_qwen_vl.examples")

#: A panels family's keys, named as no shipped family names them: panels are images, shots videos.
PANEL_KEYS = {"panel_grid": MediaKey(role="grid", medium="image"), "shot_grid": MediaKey(role="grid", medium="video"),
              "shot_seconds": MediaKey(role="seconds", grid="shot_grid")}


class PanelReference(ReferenceKernel):
    """Qwen2.5-VL's own ``get_rope_index`` under the panels family's key names, plus, at a
    row's media tokens, the count of the media runs of the rows before it: a reference that
    numbers media across the batch (as HunYuan-VL's does)."""

    def __init__(self, model_class, config, **options):
        super().__init__(model_class, config, **options)
        self.input_keys = frozenset(PANEL_KEYS)

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, panel_grid=None, shot_grid=None,
                   shot_seconds=None):
        positions, deltas = super().rope_index(input_ids, attention_mask, cu_seqlens=cu_seqlens,
                                               image_grid_thw=panel_grid, video_grid_thw=shot_grid,
                                               second_per_grid_ts=shot_seconds)
        media = (input_ids == self.media_ids[0]) | (input_ids == self.media_ids[1])
        starts = media & ~torch.nn.functional.pad(media, (1, 0))[:, :-1]  # each run's first token
        before = starts.sum(1).cumsum(0) - starts.sum(1)
        positions = positions.clone()
        positions[0] += (before[:, None] * media).to(positions.dtype)
        return positions, deltas


class PanelsPlugin:
    """Binds Qwen2.5-VL's processor to the panels reference and declares its keys ``media``."""

    def __init__(self, media):
        self.media = media

    @hookimpl
    def bind_rope_index(self, processor, config):
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

        from mmrope_core.mrope import MropeFamily

        family = MropeFamily("Panels", spatial_merge_size=2, image_token_id=processor.image_token_id,
                             video_token_id=processor.video_token_id, image_key="panel_grid",
                             video_key="shot_grid")
        kernel = PanelReference(Qwen2_5_VLModel, config, token_types=family.token_types())
        kernel.media_ids = (processor.image_token_id, processor.video_token_id)
        kernel.samples_independent = False
        return RopeBinding("mrope", kernel, "reference", "a panels reference")

    @hookimpl
    def batch_layout(self):
        return BatchLayout(media=self.media)


@pytest.fixture(scope="module")
def built():
    return qwen_vl_examples.build("Qwen2.5-VL")


def engine_of(built, media):
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "panels"})
    manager.register(PanelsPlugin(media), "panels")
    return RopeEngine.from_processor(*built, plugin_manager=manager)


def sample(processor, config, media):
    """One sample's ids and arguments: text around each of ``media`` (("panel"|"shot", grid))."""
    words = processor.tokenizer.encode("the a", add_special_tokens=False)
    ids, panels, shots = list(words), [], []
    for kind, grid in media:
        token = processor.image_token_id if kind == "panel" else processor.video_token_id
        ids += [config.vision_start_token_id, *[token] * (grid[0] * grid[1] * grid[2] // 4), *words]
        (panels if kind == "panel" else shots).append(grid)
    return ids, panels, shots


def test_a_padded_batch_is_shared_out_by_the_declared_media_whatever_the_keys_are_named(built):
    processor, config = built
    engine = engine_of(built, PANEL_KEYS)
    samples = [sample(processor, config, media) for media in (
        [("panel", (1, 4, 4)), ("shot", (2, 4, 4))],
        [],
        [("shot", (1, 4, 8)), ("panel", (1, 4, 4)), ("panel", (1, 8, 4))],
    )]
    seconds = [[0.5], [], [2.0]]
    width = max(len(ids) for ids, _, _ in samples)
    input_ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, (ids, _, _) in enumerate(samples):
        input_ids[row, :len(ids)], mask[row, :len(ids)] = torch.tensor(ids), 1
    kwargs = {"panel_grid": torch.tensor([grid for _, panels, _ in samples for grid in panels]),
              "shot_grid": torch.tensor([grid for _, _, shots in samples for grid in shots]),
              "shot_seconds": torch.tensor([value for row in seconds for value in row])}
    counts = [{"image": len(panels), "video": len(shots), "audio": 0} for _, panels, shots in samples]
    assert kwargs["panel_grid"].shape[0] == len(samples)  # as many panels as rows: no count of rows tells them apart

    positions, deltas = each_row_alone(engine, input_ids, mask, kwargs, counts)

    whole, _ = engine.get_rope_index(input_ids, mask, **kwargs)
    differs = False
    for row, (ids, panels, shots) in enumerate(samples):
        own = {"panel_grid": torch.tensor(panels) if panels else None,
               "shot_grid": torch.tensor(shots) if shots else None,
               "shot_seconds": torch.tensor(seconds[row]) if shots else None}
        alone, delta = engine.get_rope_index(torch.tensor([ids]), None, **own)
        assert torch.equal(positions[:, row, :len(ids)], alone[:, 0])
        assert torch.equal(deltas[row], delta[0])
        differs |= not torch.equal(whole[:, row, :len(ids)], alone[:, 0])
    assert differs  # the batch in one call would have given a row other positions


def test_a_grid_whose_medium_is_not_declared_is_refused_not_guessed(built):
    processor, config = built
    engine = engine_of(built, {**PANEL_KEYS, "panel_grid": MediaKey(role="grid")})
    ids, panels, _ = sample(processor, config, [("panel", (1, 4, 4))])
    input_ids = torch.tensor([ids, ids])
    with pytest.raises(CollateError, match=r"cannot share 'panel_grid' out.*it holds 2 entries; its plugin's batch_layout "
                                           r"does not say which media items .*for 'panel_grid'\)"):
        each_row_alone(engine, input_ids, torch.ones_like(input_ids), {"panel_grid": torch.tensor(panels * 2)},
                       [{"image": 1}, {"image": 1}])


def test_an_undeclared_key_as_long_as_the_rows_and_the_images_is_refused(built):
    """Two images in one row of two: an undeclared ``(2, 3)`` tensor may hold one entry per row or
    one per image; mmrope asks for its declaration rather than guess."""
    processor, config = built
    engine = engine_of(built, PANEL_KEYS)
    ids, panels, _ = sample(processor, config, [("panel", (1, 4, 4)), ("panel", (1, 4, 4))])
    input_ids = torch.tensor([ids, ids])
    with pytest.raises(CollateError, match=r"cannot share 'extra' out.*it holds 2 entries, one per batch row or one "
                                           r"per image of its samples.*MediaKey\(medium='image'\)"):
        each_row_alone(engine, input_ids, torch.ones_like(input_ids),
                       {"panel_grid": torch.tensor(panels), "extra": torch.zeros(2, 3)},
                       [{"image": 2}, {"image": 0}])


def test_seconds_whose_grid_declares_no_medium_point_at_the_grid(built):
    """Seconds count their grid's items: the fix asked for is the grid's declaration."""
    processor, config = built
    engine = engine_of(built, {**PANEL_KEYS, "shot_grid": MediaKey(role="grid")})
    ids, _, _ = sample(processor, config, [("shot", (2, 4, 4))])
    input_ids = torch.tensor([ids, ids])
    with pytest.raises(CollateError, match=r"cannot share 'shot_seconds' out.*MediaKey\(role='grid', medium=.*for "
                                           r"'shot_grid'\)"):
        each_row_alone(engine, input_ids, torch.ones_like(input_ids), {"shot_seconds": torch.tensor([0.5, 1.0])},
                       [{"video": 1}, {"video": 1}])
