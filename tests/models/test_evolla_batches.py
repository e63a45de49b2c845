"""Evolla at the model: its processor takes proteins (tokenized by an ESM tokenizer) and chat
messages, and its text decoder cross-attends each batch row's tokens to that row's protein, with
no placeholder token in the text. A ``PaddedCollator`` batch, padded on either side, equals the
processor's own batched call and trains each sample as alone; a packed row is refused, and the
same row built by hand shows why, each cause apart: its decoder's causal mask, built without the
position ids, lets a segment attend to the ones before it, and a row holds one protein.

The processor is the real ``EvollaProcessor``, built from a tiny ESM vocabulary (the real one's
special tokens at its ids, ``<pad>`` at 1) and a word-level text tokenizer with a chat template;
the model is a tiny random ``EvollaForProteinText2Text``.
"""

from __future__ import annotations

import functools
import itertools
import random
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import _enliven, assert_loss_and_gradients

from mmrope_core import CollateError, PackingUnsupportedError, RopeEngine
from mmrope_core.collators import PackedCollator, PaddedCollator
from mmrope_core.tiny import FILLER_WORDS, word_level_tokenizer

torch.set_num_threads(1)  # two cores, shared
pytestmark = [pytest.mark.differential,
              pytest.mark.skipif("evolla" not in transformers.CONFIG_MAPPING, reason="no evolla in this transformers")]

SIDES = ("right", "left")
# float32 sums in another order
LOGITS = {"rtol": 1e-4, "atol": 5e-5}
#: residues and foldseek states: the structure-aware vocabulary pairs each residue with a state
AMINO, FOLDSEEK = "ACDEG", "acdpv"
ESM_SPECIALS = ("<cls>", "<pad>", "<eos>", "<unk>", "<mask>")  # at the real ESM vocabulary's ids
TEXT_TOKENS = {"header_start": "<|start_header_id|>", "header_end": "<|end_header_id|>", "turn_end": "<|eot_id|>",
               "padding": "<|reserved_special_token_0|>"}  # the processor pads the text with the last
CHAT_TEMPLATE = ("{% for message in messages %}<|start_header_id|> {{ message['role'] }} <|end_header_id|> "
                 "{{ message['content'] }} <|eot_id|> {% endfor %}"
                 "{% if add_generation_prompt %}<|start_header_id|> assistant <|end_header_id|>{% endif %}")


def evolla_processor(directory):
    vocab = Path(directory) / "vocab.txt"
    vocab.write_text("\n".join([*ESM_SPECIALS, *(residue + state for residue in AMINO for state in FOLDSEEK)]))
    tokenizer = word_level_tokenizer(TEXT_TOKENS, words=(*FILLER_WORDS, "user", "assistant"))
    tokenizer.chat_template = CHAT_TEMPLATE
    return transformers.EvollaProcessor(transformers.EsmTokenizer(str(vocab)), tokenizer)


@functools.cache
def evolla():
    """The processor, a tiny random model and the engine."""
    with tempfile.TemporaryDirectory() as directory:
        processor = evolla_processor(directory)
    text, protein = processor.tokenizer, processor.protein_tokenizer
    config = transformers.EvollaConfig(
        vocab_size=len(text), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, aligner_num_add_layers=2, aligner_attention_probs_dropout_prob=0.0,
        resampler_depth=1, resampler_dim_head=16, resampler_heads=2, resampler_num_latents=4, resampler_ff_mult=1,
        bos_token_id=None, eos_token_id=text.convert_tokens_to_ids(TEXT_TOKENS["turn_end"]),
        protein_encoder_config={"vocab_size": len(protein), "hidden_size": 32, "intermediate_size": 64,
                                "num_hidden_layers": 1, "num_attention_heads": 2,
                                "pad_token_id": protein.pad_token_id, "mask_token_id": protein.mask_token_id})
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.EvollaForProteinText2Text(config).eval()
        _enliven(model)
        with torch.no_grad():  # open gates: a protein moves the logits far above float32 noise
            for name, parameter in model.named_parameters():
                if name.endswith(("gate_attention", "gate_ffw")):
                    parameter.fill_(1.0)
    return processor, config, model, RopeEngine.from_processor(processor, config)


def calls():
    """Three samples: proteins of 6, 3 and 9 residues, prompts of 4, 7 and 2 words."""
    rng = random.Random(0)
    found = []
    for residues, words in ((6, 4), (3, 7), (9, 2)):
        protein = {"aa_seq": "".join(rng.choice(AMINO) for _ in range(residues)),
                   "foldseek": "".join(rng.choice(FOLDSEEK) for _ in range(residues))}
        content = " ".join(rng.choice(FILLER_WORDS) for _ in range(words))
        found.append({"proteins": [protein], "messages_list": [[{"role": "user", "content": content}]]})
    return found


def samples_of(processor):
    return [dict(processor(**call)) for call in calls()]


def processor_batch(processor, side):
    """The processor's own batched call (it pads the text on its tokenizer's side, the proteins on
    the right)."""
    everything = calls()
    saved, processor.tokenizer.padding_side = processor.tokenizer.padding_side, side
    try:
        return dict(processor(proteins=[call["proteins"][0] for call in everything],
                              messages_list=[call["messages_list"][0] for call in everything]))
    finally:
        processor.tokenizer.padding_side = saved


def alone(model, sample):
    """The sample's logits and its summed token loss, the model computing its own positions."""
    out = model(**sample, use_cache=False)
    labels = sample["input_ids"][0, 1:]
    return out.logits[0], torch.nn.functional.cross_entropy(out.logits[0, :-1], labels, reduction="sum"), len(labels)


@pytest.mark.parametrize("side", SIDES)
def test_a_padded_evolla_batch_is_its_processors_and_trains_as_its_samples_alone(side):
    processor, _, model, engine = evolla()
    samples = samples_of(processor)
    lengths = {tuple(sample["protein_input_ids"].shape) for sample in samples}
    assert len(lengths) == len(samples)  # proteins of different lengths: the batch pads them
    batch = PaddedCollator(engine, padding_side=side)(samples)
    reference = processor_batch(processor, side)
    assert set(reference) <= set(batch)
    for key, value in reference.items():  # protein ids padded with ESM's pad id, on the right
        torch.testing.assert_close(batch[key], value.to(batch[key].dtype), rtol=0, atol=0,
                                   msg=lambda m, key=key: f"{key}: {m}")
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits
        for index, sample in enumerate(samples):
            torch.testing.assert_close(logits[index][mask[index]], alone(model, sample)[0], **LOGITS,
                                       msg=lambda m, index=index: f"sample {index}: {m}")
    model.zero_grad(set_to_none=True)
    losses = [alone(model, sample)[1:] for sample in samples]
    expected = sum(loss for loss, _ in losses) / sum(count for _, count in losses)
    assert_loss_and_gradients(model, expected, lambda: model(**batch, use_cache=False).loss)


def test_a_sample_without_its_protein_is_refused_beside_samples_with_one():
    processor, _, _, engine = evolla()
    samples = samples_of(processor)
    text_only = {key: value for key, value in samples[1].items() if not key.startswith("protein_")}
    with pytest.raises(CollateError, match=r"sample 1 has no 'protein_input_ids'.*places each row's"):
        PaddedCollator(engine)([samples[0], text_only])


def packed_by_hand(engine, samples, proteins):
    """The samples' packed row built without the collator: ids joined, each segment's positions its
    sample's alone, and the proteins of the samples ``proteins`` picks (the model takes one a row)."""
    ids = torch.cat([sample["input_ids"] for sample in samples], dim=1)
    positions = torch.cat([engine.compute_position_ids(sample["input_ids"], None, {}) for sample in samples], dim=-1)
    media = engine.collate([{key: value for key, value in samples[index].items() if key.startswith("protein_")}
                            for index in proteins])
    return {"input_ids": ids, "position_ids": positions, **media, "use_cache": False}


def test_a_packed_evolla_row_is_refused_as_its_segments_would_see_each_other_and_one_protein():
    processor, _, model, engine = evolla()
    samples = samples_of(processor)
    with pytest.raises(PackingUnsupportedError, match=r"evolla.*causal mask without the position ids.*one protein"):
        PackedCollator(engine)
    bounds = [0, *itertools.accumulate(sample["input_ids"].shape[1] for sample in samples)]

    def differences(row):
        return [float((row[bounds[index]:bounds[index + 1]] - theirs).abs().max()) for index, theirs in enumerate(own)]

    with torch.no_grad():
        own = [alone(model, sample)[0] for sample in samples]
        # the row holding the first sample's protein, as the model takes one a row
        first = model(**packed_by_hand(engine, samples, [0])).logits
        # every sample's protein: the model broadcasts the one row over them, copy i reading protein i
        every = model(**packed_by_hand(engine, samples, range(len(samples)))).logits
    assert first.shape[0] == 1 and every.shape[0] == len(samples)
    found = differences(first[0])
    print(f"evolla: a packed row with the first protein differs from the samples alone by {found}")
    assert found[0] < 5e-5 and min(found[1:]) > 1e-2, found
    # the mask: a later segment reading its own protein still differs (it attends to the segments before it)
    own_protein = [differences(every[index])[index] for index in range(1, len(samples))]
    print(f"evolla: later segments reading their own protein differ by {own_protein}")
    assert min(own_protein) > 1e-2, own_protein
    # the protein: the first segment (no segment before it) reading another sample's protein differs
    other_protein = [differences(every[index])[0] for index in range(1, len(samples))]
    print(f"evolla: the first segment reading another sample's protein differs by {other_protein}")
    assert min(other_protein) > 1e-3, other_protein
