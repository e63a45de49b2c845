"""Sequence and context parallel on real processors and tiny random models: every rank's batch of
``PackedCollator(split=...)`` holds its tokens with the ids, labels and positions they have
without the split (each segment's positions its sample's alone, videos and Omni's audio in video
included), and the whole padded row the ranks hold together gives each segment its sample's logits."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from media_samples import audio_in_video_sample, video_sample
from tiny_models import tiny_model

from mmrope_core import RopeEngine
from mmrope_core.collators import IGNORE_INDEX, PackedCollator
from mmrope_core.parallel import SCHEMES, split_index

torch.set_num_threads(1)  # two cores, shared
FAMILIES = ("Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen2.5-Omni", "Qwen3-Omni")
AUDIO_IN_VIDEO = ("Qwen2.5-Omni", "Qwen3-Omni")
LOGITS = {"rtol": 1e-4, "atol": 1e-5}  # float32 sums in another order


def family(name):
    """The tiny model's engine and a row of samples: the case's own, one with videos (with their
    audio for Omni) and one of text alone; each unpadded, labels their ids."""
    tiny = tiny_model(name)
    rng, generator = random.Random(name), torch.Generator().manual_seed(0)
    samples = list(tiny.samples)
    if name in AUDIO_IN_VIDEO:
        samples.insert(1, audio_in_video_sample(tiny.processor, tiny.model.config, rng, generator))
    else:
        samples.insert(1, video_sample(tiny.processor, rng, generator))
    tokenizer = tiny.processor.tokenizer
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(tokenizer.tokenize("the cat sat on a mat"))])
    text = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    text.update({key: torch.zeros_like(ids) for key in tiny.samples[0] if key.endswith("token_type_ids")})
    samples = [{**sample, "labels": sample["input_ids"].clone()} for sample in [*samples, text]]
    kwargs = {"use_audio_in_video": True} if name in AUDIO_IN_VIDEO else {}
    return tiny, RopeEngine.from_processor(tiny.processor, tiny.config), samples, kwargs


def alone(engine, sample, kwargs):
    """The sample's own positions, ``(4, L)`` or ``(L,)``."""
    media = {key: value for key, value in sample.items()
             if key not in ("input_ids", "attention_mask", "labels") and not key.endswith("token_type_ids")}
    return engine.compute_position_ids(sample["input_ids"], None, media, kwargs)[0]


def whole_row(parts, scheme, size):
    """The ranks' batches put back together: every per-token tensor of the padded row."""
    layout = parts[0]["cu_seqlens_padded"]
    index = torch.cat([split_index(layout, scheme=scheme, size=size, rank=rank) for rank in range(size)])
    assert sorted(index.tolist()) == list(range(int(layout[-1])))  # every slot held by one rank
    row = {}
    for key, value in parts[0].items():
        if isinstance(value, torch.Tensor) and value.shape[-1] == index.numel() // size and key not in (
                "cu_seqlens_padded", "cu_seq_lens_q", "cu_seq_lens_k") and (key.endswith("_ids") or key in ("labels", "shift_labels", "seq_idx")):
            whole = value.new_empty((*value.shape[:-1], index.numel()))
            whole[..., index] = torch.cat([part[key] for part in parts], dim=-1)
            row[key] = whole
    return row


def real_slots(samples, layout):
    """Where each sample's tokens lie in the padded row."""
    return [slice(int(start), int(start) + sample["input_ids"].shape[1]) for sample, start in zip(samples, layout)]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_ranks_tokens_keep_their_ids_labels_and_positions(name):
    tiny, engine, samples, kwargs = family(name)
    before = [{key: value.clone() for key, value in sample.items()} for sample in samples]
    full = PackedCollator(engine, mm_processor_kwargs=kwargs or None)(samples)
    own = [alone(engine, sample, kwargs) for sample in samples]
    pad = tiny.processor.tokenizer.pad_token_id
    token_keys = [key for key in full if key in ("input_ids", "labels", "position_ids") or key.endswith("token_type_ids")]
    for scheme in SCHEMES:
        for size in (2, 4, 8):
            parts = [PackedCollator(engine, mm_processor_kwargs=kwargs or None, split=(scheme, size, rank))(samples)
                     for rank in range(size)]
            layout = parts[0]["cu_seqlens_padded"]
            for part in parts:  # every rank: the same row, media and boundaries; its own T / size tokens
                assert part.keys() == parts[0].keys()
                assert torch.equal(part["cu_seq_lens_q"], parts[0]["cu_seq_lens_q"])
                assert torch.equal(part["cu_seqlens_padded"], layout)
                assert part["input_ids"].shape == (1, int(layout[-1]) // size)
                for key in full.keys() - {*token_keys, "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"}:
                    assert torch.equal(part[key], full[key]) if isinstance(full[key], torch.Tensor) else part[key] == full[key]
            row = whole_row(parts, scheme, size)
            slots = real_slots(samples, layout if scheme == "zigzag" else layout.new_tensor(
                [0, *torch.tensor([s["input_ids"].shape[1] for s in samples]).cumsum(0).tolist()]))
            held = torch.zeros(int(layout[-1]), dtype=torch.bool)
            start = 0
            for sample, slot, positions in zip(samples, slots, own):
                length = sample["input_ids"].shape[1]
                mine = slice(start, start + length)  # the unsplit row's
                for key in token_keys:
                    assert torch.equal(row[key][..., slot], full[key][..., mine]), (scheme, size, key)
                laid = row["position_ids"][:, 0, slot] if engine.rope_kind == "mrope" else row["position_ids"][0, slot]
                assert torch.equal(laid, positions), (scheme, size)
                held[slot] = True
                start += length
            ends = [slot.start for slot in slots[1:]]
            for slot, end in zip(slots, [*ends, int(layout[-1])]):  # padding: text continuing its segment
                last = row["position_ids"][..., slot.stop - 1: slot.stop]
                steps = torch.arange(1, end - slot.stop + 1)
                assert torch.equal(row["position_ids"][..., slot.stop:end], last + steps), (scheme, size)
            padding = ~held  # ids the pad token, no loss, positions of text continuing the segment
            assert (row["input_ids"][0, padding] == pad).all() and (row["labels"][0, padding] == IGNORE_INDEX).all()
            assert padding.sum() < (2 * size) * len(samples)
    for sample, original in zip(samples, before):  # the caller's samples are as they were
        assert all(torch.equal(sample[key], original[key]) for key in original)


@pytest.mark.differential
@pytest.mark.parametrize("name", ["Qwen2-VL", "Qwen2.5-VL"])
@pytest.mark.parametrize("scheme, size", [("zigzag", 2), ("contiguous", 4)])
def test_the_ranks_row_gives_each_segment_its_samples_logits(name, scheme, size):
    """Attention needs the other ranks' keys, so the ranks' shards are put back together, as the
    frameworks' all-gather does, and the whole padded row runs once: padding continues its
    segment's positions after its real tokens, so no real token attends to it."""
    tiny, engine, samples, _ = family(name)
    parts = [PackedCollator(engine, split=(scheme, size, rank))(samples) for rank in range(size)]
    row = {**parts[0], **whole_row(parts, scheme, size)}
    with torch.no_grad():
        logits = tiny.model(**row).logits[0]
        layout = parts[0]["cu_seqlens_padded"].tolist()
        starts = layout if scheme == "zigzag" else [0, *torch.tensor([s["input_ids"].shape[1] for s in samples])
                                                     .cumsum(0).tolist()]
        for index, (sample, slot) in enumerate(zip(samples, real_slots(samples, starts))):
            theirs = tiny.model(**sample, use_cache=False).logits[0]
            torch.testing.assert_close(logits[slot], theirs, **LOGITS, msg=lambda m, index=index: f"sample {index}: {m}")


LINEAR_ATTENTION_CHILD = f"""
import sys
sys.path[:0] = [{str(Path(__file__).parent / "stand_in_kernels")!r}, {str(Path(__file__).parent)!r}]
import torch
import transformers.utils.import_utils as import_utils
# what transformers and torch answer on a GPU with the kernels (see test_linear_attention_kernels.py)
import_utils.is_flash_linear_attention_available = lambda: True
import_utils.is_causal_conv1d_available = lambda: True
torch.cuda.current_device = lambda: 0

from test_packed_rows import LOGITS, case, rows_of
from test_parallel_rows import real_slots, whole_row
from mmrope_core.collators import PackedCollator

tiny, engine = case("Qwen3.5", None)
samples = rows_of(tiny)[0]
for scheme, size in (("zigzag", 2), ("contiguous", 4)):
    parts = [PackedCollator(engine, split=(scheme, size, rank))(samples) for rank in range(size)]
    row = {{**parts[0], **whole_row(parts, scheme, size)}}
    assert row["seq_idx"].shape == row["input_ids"].shape
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    starts = row["cu_seqlens_padded"].tolist() if scheme == "zigzag" else [0, *torch.tensor(lengths).cumsum(0).tolist()]
    with torch.no_grad():
        logits = tiny.model(**row).logits[0]
        for sample, slot in zip(samples, real_slots(samples, starts)):
            torch.testing.assert_close(logits[slot], tiny.model(**sample, use_cache=False).logits[0], **LOGITS)
    print(scheme, "exact")
"""


@pytest.mark.differential
def test_linear_attention_takes_the_ranks_row_with_padding_as_segments_of_its_own():
    """Qwen3.5's linear attention runs along the row: its kernels (stand-ins honouring their
    varlen arguments, in a child process) must keep each padding run apart, as ``seq_idx`` and
    ``cu_seq_lens_q`` say."""
    result = subprocess.run([sys.executable, "-c", LINEAR_ATTENTION_CHILD], capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "zigzag exact" in result.stdout and "contiguous exact" in result.stdout


@pytest.mark.parametrize("name", ["Qwen2.5-VL", "Qwen3-VL"])
def test_the_model_hands_its_loss_the_shift_labels_a_rank_holds(name):
    """A rank's ``shift_labels`` (the collator's, made on the whole row) reach the model's
    loss in place of its own shift of ``labels``: here the first half of the row's next-token
    labels is dropped, and the loss is that of the rest. Qwen3-VL on transformers 5.10 hands its
    loss no keyword arguments: there the loss is computed from the logits."""
    import transformers
    from packaging.version import Version
    from transformers.loss.loss_utils import ForCausalLMLoss

    tiny, engine, samples, _ = family(name)
    row = PackedCollator(engine, split=("zigzag", 2, None))(samples)
    shift_labels = row.pop("shift_labels")
    assert torch.equal(shift_labels, torch.nn.functional.pad(row["labels"][:, 1:], (0, 1), value=IGNORE_INDEX))
    shift_labels[:, : shift_labels.shape[1] // 2] = IGNORE_INDEX
    with torch.no_grad():
        output = tiny.model(**row, shift_labels=shift_labels)
        own = tiny.model(**row).loss
    expected = ForCausalLMLoss(output.logits, None, output.logits.shape[-1], shift_labels=shift_labels)
    assert not torch.isclose(expected, own)
    if name == "Qwen3-VL" and Version(transformers.__version__) < Version("5.24"):
        torch.testing.assert_close(output.loss, own)  # shift_labels dropped: the model shifted labels itself
    else:
        torch.testing.assert_close(output.loss, expected)
