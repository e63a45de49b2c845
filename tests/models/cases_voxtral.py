"""Voxtral for the model-level collator tests (see test_padded_batches.py): ``extra_cases()``
gives it as ``name -> (build() -> (processor, config), calls(processor, rng), overrides)``.

The real ``VoxtralProcessor`` and its real feature extractor (Whisper's, 128 mel bins), with a
stand-in for one part: its tokenizer backend, ``MistralCommonBackend``, needs mistral-common,
which the tests run without. :class:`MistralCommonStandIn` keeps the contract the processor reads
from it: ``apply_chat_template`` encodes a user turn as mistral-common's instruct tokenizers V7
(the first with audio) to V13 do: ``<s> [INST]``, its chunks in order, ``[/INST]``. A clip's
chunk is ``[BEGIN_AUDIO]`` then one ``[AUDIO]`` per ``audio_length_per_tok`` mel frames (8: 16
kHz, 12.5 tokens a second, hop 160) of the clip padded with silence to a multiple of 30 s, so 375
a 30 s chunk, and the padded clip is handed back as ``audio``; the rows are padded as the backend
pads them (its own ``__call__``, on the tokenizer's side). The token ids are Voxtral's
(``[AUDIO]`` 24, which the processor hard-codes, ``[BEGIN_AUDIO]`` 25, ``<pad>`` 11). The
processor takes audio only through ``apply_chat_template`` (its ``__call__`` takes text alone):
:class:`VoxtralChatProcessor` turns the tests' call (texts and clips) into that conversation,
each ``<clip>`` of a text the next clip, a chunk of its own between the text's.
"""

from __future__ import annotations

import math
import re

import numpy as np

#: Voxtral's special tokens at their ids in its tekken vocabulary (the rest reserved).
SPECIALS = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]", 11: "<pad>", 24: "[AUDIO]",
            25: "[BEGIN_AUDIO]"}
#: Where a test's text places its next clip (a chunk of the user turn of its own).
CLIP = "<clip>"
#: mistral-common's audio config of Voxtral: samples a second, tokens a second, mel hop, chunk seconds.
SAMPLING_RATE, FRAME_RATE, HOP_LENGTH, CHUNK_SECONDS = 16000, 12.5, 160, 30


def extra_cases():
    import transformers

    if "voxtral" not in transformers.CONFIG_MAPPING or not hasattr(transformers, "VoxtralProcessor"):
        return {}
    # the encoder's states regrouped by 4 (intermediate_size = 4 * hidden_size): 375 a 30 s chunk
    return {"Voxtral (voxtral)": (build, clips, (("audio_config.hidden_size", 64),
                                                   ("audio_config.intermediate_size", 256)))}


def audio_tokens(samples):
    """mistral-common's count for a clip of ``samples`` (already padded to whole chunks)."""
    per_token = int(SAMPLING_RATE // FRAME_RATE) // HOP_LENGTH
    frames = samples // HOP_LENGTH if samples % HOP_LENGTH == 0 else math.ceil(samples / HOP_LENGTH - 1)
    return math.ceil(frames / per_token)


def stand_in_class():
    from transformers import PreTrainedTokenizerFast

    class MistralCommonStandIn(PreTrainedTokenizerFast):
        """``MistralCommonBackend`` without mistral-common: see the module's docstring."""

        def apply_chat_template(self, conversation, tools=None, add_generation_prompt=False,
                                continue_final_message=False, tokenize=True, padding=False, truncation=False,
                                max_length=None, return_tensors=None, return_dict=True, **kwargs):
            if tools or add_generation_prompt or continue_final_message or not tokenize or not return_dict:
                raise NotImplementedError("the stand-in encodes user turns to a dict of ids only")
            batched = isinstance(conversation[0], (list, tuple))
            rows, audio = [], []
            for turns in conversation if batched else [conversation]:
                (turn,) = turns
                if turn["role"] != "user":
                    raise NotImplementedError("the stand-in encodes one user turn")
                row = [self.convert_tokens_to_ids("<s>"), self.convert_tokens_to_ids("[INST]")]
                for content in turn["content"]:
                    if content["type"] == "audio":
                        clip = np.asarray(content["audio"], dtype=np.float32)
                        chunk = SAMPLING_RATE * CHUNK_SECONDS
                        clip = np.pad(clip, (0, math.ceil(clip.shape[-1] / chunk) * chunk - clip.shape[-1]))
                        row += [self.convert_tokens_to_ids("[BEGIN_AUDIO]")]
                        row += [self.convert_tokens_to_ids("[AUDIO]")] * audio_tokens(clip.shape[-1])
                        audio.append(clip)
                    else:
                        row += self.encode(content["text"], add_special_tokens=False)
                row.append(self.convert_tokens_to_ids("[/INST]"))
                rows.append(row)
            if truncation or max_length is not None or kwargs:
                raise NotImplementedError(f"the stand-in neither truncates nor takes {sorted(kwargs)}")
            out = self(rows if batched else rows[0], padding=padding, add_special_tokens=False,
                       return_tensors=return_tensors)
            if audio:
                out.data["audio"] = audio
            return out

        def __call__(self, text=None, **kwargs):  # ids already encoded, as the backend takes them
            if isinstance(text, list) and text and isinstance(text[0], int | list):
                ids = text if isinstance(text[0], list) else [text]
                padded = self.pad({"input_ids": ids}, padding=kwargs.get("padding", False),
                                  return_tensors=kwargs.get("return_tensors"))
                if not isinstance(text[0], list) and kwargs.get("return_tensors") is None:
                    padded = padded.__class__({key: value[0] for key, value in padded.items()})
                return padded
            return super().__call__(text, **kwargs)

    return MistralCommonStandIn


def stand_in_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    from mmrope_core.tiny import FILLER_WORDS

    specials = [SPECIALS.get(index, f"<SPECIAL_{index}>") for index in range(32)]
    vocab = {token: index for index, token in enumerate([*specials, *dict.fromkeys(FILLER_WORDS)])}
    model = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = stand_in_class()(tokenizer_object=model, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                 eos_token="</s>")
    tokenizer.add_special_tokens({"additional_special_tokens": [token for token in specials if token not in
                                                                ("<unk>", "<s>", "</s>", "<pad>")]})
    return tokenizer


def processor_class():
    import transformers

    class VoxtralChatProcessor(transformers.VoxtralProcessor):
        """The real processor, called as the tests call every processor: each text (and its clip)
        a user turn given to its ``apply_chat_template``, which alone takes audio."""

        def __call__(self, text=None, audio=None, padding=False, padding_side=None, return_tensors="pt", **kwargs):
            if kwargs:
                raise TypeError(f"unexpected arguments {sorted(kwargs)}")
            texts = [text] if isinstance(text, str) else list(text)
            clips = iter(audio or [])
            conversations = [[{"role": "user", "content": [
                {"type": "audio", "audio": next(clips)} if part == CLIP else {"type": "text", "text": part.strip()}
                for part in re.split(f"({re.escape(CLIP)})", words) if part.strip()]}] for words in texts]
            if next(clips, None) is not None:
                raise ValueError(f"more clips than {CLIP} in the texts")
            saved = self.tokenizer.padding_side
            self.tokenizer.padding_side = padding_side or saved
            try:
                return self.apply_chat_template(conversations, tokenize=True, return_dict=True,
                                                return_tensors=return_tensors,
                                                processor_kwargs={"padding": padding or False})
            finally:
                self.tokenizer.padding_side = saved

    return VoxtralChatProcessor


def build():
    import transformers

    processor = processor_class()(transformers.WhisperFeatureExtractor(feature_size=128), stand_in_tokenizer())
    config = transformers.AutoConfig.for_model("voxtral")
    config.audio_token_id = processor.audio_token_id
    return processor, config


def clips(processor, rng):
    """Two samples with a clip each, of 1 and 2 seconds (each padded to one 30 s chunk)."""
    from mmrope_core.tiny import filler_text

    return [{"text": [f"{CLIP} {filler_text(rng, words)}"],
             "audio": [np.sin(np.arange(SAMPLING_RATE * seconds) / rng.uniform(5, 40)).astype(np.float32)],
             "return_tensors": "pt"} for words, seconds in ((4, 1), (2, 2))]
