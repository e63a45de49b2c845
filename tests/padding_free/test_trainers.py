"""transformers' Trainer and TRL's SFTTrainer train tiny models on the same samples three ways:
one sample per forward with the model computing its own positions (the reference), padded
batches and packed rows with mmrope's. The losses of every step and the gradients before every
optimizer step agree with the reference, and each packed segment's logits are its sample's alone."""

from __future__ import annotations

import runpy
from pathlib import Path

import datasets
import pytest
import torch
import transformers
import trl
from padding_free_cases import FAMILIES, MM_PROCESSOR_KWARGS, engine_of, samples, tiny_model

from mmrope_core.collators import PackedCollator, PaddedCollator

STEPS, BATCH = 3, 4
torch.set_num_threads(1)  # two cores, shared
# TRL's SFTConfig passes transformers a deprecated argument name of its own
pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")


class Recorder(transformers.TrainerCallback):
    """The loss of every step and the gradients the optimizer is about to apply."""

    def __init__(self):
        self.losses, self.gradients = [], []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradients.append({name: p.grad.detach().clone() for name, p in model.named_parameters()
                               if p.grad is not None})

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            self.losses.append(logs["loss"])


def as_dataset(samples):
    """The samples as a ``datasets`` table read as tensors, row by row: a row holds None for the
    media its sample lacks (``from_list`` takes the columns from the first row: name them all)."""
    keys = dict.fromkeys(key for sample in samples for key in sample)
    table = datasets.Dataset.from_list([{key: sample.get(key) for key in keys} for sample in samples])
    return table.to_iterable_dataset().with_format("torch")


class OwnPositions:
    """One sample per forward, as the processor gave it, labels its ids: the model computes its
    own positions (no ``position_ids``) from the sample alone."""

    def __init__(self, mm_processor_kwargs):
        self.mm_processor_kwargs = mm_processor_kwargs or {}

    def __call__(self, rows):
        (row,) = rows
        sample = {key: value for key, value in row.items() if value is not None}
        return {**sample, "labels": sample["input_ids"].clone(), **self.mm_processor_kwargs, "use_cache": False}


def token_sum_loss(outputs, labels, num_items_in_batch):
    """The next-token loss summed over one forward's tokens, divided by the whole batch's token
    count: summed over the forwards of a batch, the batch's mean token loss (what the model's own
    loss is on a padded or packed batch)."""
    logits = outputs.logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                             ignore_index=-100, reduction="sum") / num_items_in_batch


def train(trainer, name, way, tmp_path):
    model = tiny_model(name)
    engine = engine_of(name, model)
    kwargs = MM_PROCESSOR_KWARGS.get(name)
    collator = {"own": lambda: OwnPositions(kwargs), "padded": lambda: PaddedCollator(engine, mm_processor_kwargs=kwargs),
                "packed": lambda: PackedCollator(engine, mm_processor_kwargs=kwargs)}[way]()
    dataset = as_dataset(samples(name, STEPS * BATCH))
    recorder = Recorder()
    # one sample per forward accumulates the batch's gradients: the trainers then divide the summed
    # token losses by the batch's token count, as they do for a padded or packed batch
    batch = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": BATCH} if way == "own" else {
        "per_device_train_batch_size": BATCH}
    # SGD: Adam divides by the gradients' size, so rounding in gradients near zero would move whole steps
    common = {"output_dir": str(tmp_path), **batch, "max_steps": STEPS, "optim": "sgd",
              "learning_rate": 0.5, "lr_scheduler_type": "constant", "logging_steps": 1, "report_to": [],
              "save_strategy": "no", "remove_unused_columns": False, "use_cpu": True, "disable_tqdm": True,
              "seed": 0}
    loss = {"compute_loss_func": token_sum_loss} if way == "own" else {}
    if trainer == "trl":
        # TRL turns bf16 on by default, on CPU too: compare in float32
        args = trl.SFTConfig(**common, bf16=False, dataset_kwargs={"skip_prepare_dataset": True}, max_length=None)
        runner = trl.SFTTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                                processing_class=engine.processor, callbacks=[recorder], **loss)
    else:
        # accelerate would cut every tensor of a batch read from an iterable dataset to the batch size
        args = transformers.TrainingArguments(**common, accelerator_config={"dispatch_batches": False})
        runner = transformers.Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                                      callbacks=[recorder], **loss)
    runner.train()
    assert len(recorder.losses) == len(recorder.gradients) == STEPS
    return recorder


def test_the_samples_hold_what_the_families_are_tested_on():
    vl = samples("Qwen2.5-VL", STEPS * BATCH)
    seconds = torch.cat([sample["second_per_grid_ts"] for sample in vl if "second_per_grid_ts" in sample])
    assert (seconds != seconds.round()).any()  # fractional seconds per grid
    assert any("pixel_values" in sample for sample in vl) and any(len(sample) == 3 for sample in vl)  # and text alone
    omni = samples("Qwen2.5-Omni", STEPS * BATCH)
    # audio inside videos: one audio clip per video, its tokens between the video's markers
    assert any("video_grid_thw" in sample and len(sample["feature_attention_mask"]) == len(sample["video_grid_thw"])
               for sample in omni)


@pytest.mark.parametrize("trainer", ["transformers", "trl"])
@pytest.mark.parametrize("name", FAMILIES)
def test_padded_and_packed_training_equal_training_on_each_sample_alone(trainer, name, tmp_path):
    own = train(trainer, name, "own", tmp_path / "own")
    assert own.losses[0] != own.losses[-1]  # the steps change the model
    for way in ("padded", "packed"):
        trained = train(trainer, name, way, tmp_path / way)
        for step in range(STEPS):
            assert trained.losses[step] == pytest.approx(own.losses[step], rel=1e-5), f"{way}, step {step}"
            assert trained.gradients[step].keys() == own.gradients[step].keys()
            for key, gradient in own.gradients[step].items():
                torch.testing.assert_close(trained.gradients[step][key], gradient, rtol=1e-4, atol=1e-6,
                                           msg=lambda m, key=key, step=step, way=way: f"{way}, step {step}, {key}: {m}")


def logits(model, batch):
    with torch.no_grad():
        return model(**batch).logits


@pytest.mark.parametrize("name", FAMILIES)
def test_each_packed_segment_has_the_logits_of_its_sample_alone(name):
    model = tiny_model(name).eval()
    engine = engine_of(name, model)
    kwargs = MM_PROCESSOR_KWARGS.get(name)
    rows = samples(name, 4, seed=1)
    packed = PackedCollator(engine, mm_processor_kwargs=kwargs)(rows)
    row = logits(model, packed)[0]
    three_rows = logits(model, {**packed, "position_ids": packed["position_ids"][1:]})[0]
    # flash-attention's boundaries ride along harmlessly where another attention runs
    with_boundaries = PackedCollator(engine, flash_attn_kwargs=True, mm_processor_kwargs=kwargs)(rows)
    assert torch.equal(logits(model, with_boundaries)[0], row)
    start = 0
    for index, sample in enumerate(rows):
        alone = logits(model, {**sample, **(kwargs or {}), "use_cache": False})[0]  # the model's own positions
        segment = slice(start, start + sample["input_ids"].shape[1])
        torch.testing.assert_close(row[segment], alone, msg=lambda m, index=index: f"sample {index}: {m}")
        if index:  # without the text row the model sees one sequence: later segments attend to earlier ones
            assert (three_rows[segment] - alone).abs().max() > 1e-4
        start = segment.stop


def test_the_trl_example_runs(capsys):
    runpy.run_path(str(Path(__file__).parents[2] / "examples" / "trl_padding_free.py"), run_name="__main__")
    assert "2 padding-free steps" in capsys.readouterr().out
