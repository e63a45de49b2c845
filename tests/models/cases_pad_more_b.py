"""More model types the plugins bind, for the model-level collator tests (test_padded_batches.py
and test_packed_rows.py): each built from its real processor classes, offline, with a word-level
vocabulary, and its default config carrying the tokenizer's ids.

- ShieldGemma 2: its processor writes every prompt from its chat template (given here: the
  checkpoint's is on the hub), one image and one policy a row; the policies are written in the
  vocabulary's words. Its batches apply one policy to every image and take no text alone, so its
  rows are of one length: the padded tests check its media and logits, not padding.
- PP-Chart2Table: its processor expands no image token (the checkpoint's chat template writes
  the image's tokens): the prompts hold them as the template writes them, one per feature of the
  tiny vision tower.
- MOSS-Transcribe-Diarize, OmniASR, VibeVoice-ASR, Nemotron-3.5-Transcribe: their own feature
  extractors, the text holding the audio token where the clip goes (the processor expands it to
  the clip's tokens); Nemotron's word-timestamp vocabulary, which no call reads, word-level too.
- InstructBLIP: its processor adds its own image token and puts the Q-Former's queries before
  each row's text; a second tokenizer (a word-level one too) tokenizes the Q-Former's instruction.
- InstructBLIP-Video: the same, its video processor a stand-in (the real one needs torchvision):
  each video's frames rescaled and normalized by CLIP's mean and std as the real one does at their
  own size, ``pixel_values`` ``(videos, frames, 3, height, width)``; 4 frames a video, as the
  processor's tokens (the queries times 4) assume.
- UDOP (for test_udop_batches.py): its own tokenizer class over a word-level vocabulary, the
  words and their boxes given (its image processor's OCR needs pytesseract); not an extra case,
  since its padded batches are refused.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from mmrope_core.tiny import filler_text, random_image, word_level_tokenizer


def extra_cases() -> dict[str, tuple[Any, Any, tuple[tuple[str, Any], ...]]]:
    """``name -> (build() -> (processor, config), calls(processor, rng), overrides)`` of every
    model type here that the installed transformers has."""
    import transformers

    def has(model_type: str, processor: str) -> bool:
        return model_type in transformers.CONFIG_MAPPING and hasattr(transformers, processor)

    found: dict[str, tuple[Any, Any, tuple[tuple[str, Any], ...]]] = {}
    if has("shieldgemma2", "ShieldGemma2Processor"):  # patches that tile its 56-pixel images
        found["ShieldGemma 2 (shieldgemma2)"] = (shieldgemma2, shieldgemma2_calls, (("vision_config.patch_size", 14),))
    if has("pp_chart2table", "PPChart2TableProcessor"):
        found["PP-Chart2Table (pp_chart2table)"] = (pp_chart2table, pp_chart2table_calls, ())
    if has("instructblip", "InstructBlipProcessor"):  # the processor's query tokens; patches that tile its images
        found["InstructBLIP (instructblip)"] = (instructblip, image_calls,
                                                (("num_query_tokens", QUERY_TOKENS), ("vision_config.patch_size", 14),
                                                 ("text_config.word_embed_proj_dim", 32)))  # OPT's, as wide as it
    if has("instructblipvideo", "InstructBlipVideoProcessor"):
        found["InstructBLIP-Video (instructblipvideo)"] = (
            instructblipvideo, video_calls, (("num_query_tokens", QUERY_TOKENS), ("vision_config.patch_size", 14),
                                             ("vision_config.image_size", 28), ("text_config.word_embed_proj_dim", 32)))
    for name, model_type, processor, tokens, rate, overrides in AUDIO:
        if has(model_type, processor):
            found[f"{name} ({model_type})"] = (
                functools.partial(audio_model, model_type, processor, tokens),
                functools.partial(audio_calls, rate=rate), overrides)
    return found


def config_with_ids(model_type: str, tokenizer: Any, ids: dict[str, str]) -> Any:
    """The model type's default config holding the tokenizer's ids (``config key -> token``)."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type)
    for key, token in ids.items():
        setattr(config, key, tokenizer.convert_tokens_to_ids(token))
    return config


# -- ShieldGemma 2 ---------------------------------------------------------------------------------

SHIELDGEMMA2_TOKENS = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                       "eoi_token": "<end_of_image>", "bos_token": "<bos>"}
#: the image, then the policy: the order the checkpoint's template writes them in (its turn markers left out)
SHIELDGEMMA2_TEMPLATE = ("{% for message in messages %}{% for item in message['content'] %}"
                         "{% if item['type'] == 'image' %}<start_of_image> {% else %}{{ item['text'] }}{% endif %}"
                         "{% endfor %}{% endfor %}")


def shieldgemma2():
    import transformers
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tokenizer = word_level_tokenizer(SHIELDGEMMA2_TOKENS)
    processor = transformers.ShieldGemma2Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": 56, "width": 56}), tokenizer=tokenizer,
        chat_template=SHIELDGEMMA2_TEMPLATE, image_seq_length=4,
        policy_definitions={"cat": "the cat sat on a mat", "dog": "a dog"})
    config = config_with_ids("shieldgemma2", tokenizer, {"image_token_index": "<image_soft_token>",
                                                         "boi_token_index": "<start_of_image>",
                                                         "eoi_token_index": "<end_of_image>"})
    return processor, config


def shieldgemma2_calls(processor, rng):
    """Two images, each classified against one policy (the processor writes the prompt)."""
    return [{"images": [random_image(rng, 28 * side, 28 * side)], "text": [""], "policies": ["cat"],
             "return_tensors": "pt"} for side in (1, 2)]


# -- PP-Chart2Table --------------------------------------------------------------------------------

PP_CHART2TABLE_TOKENS = {"image_token": "<imgpad>", "img_start": "<img>", "img_end": "</img>"}


def pp_chart2table():
    import transformers
    from transformers.models.pp_chart2table.image_processing_pil_pp_chart2table import PPChart2TableImageProcessorPil

    tokenizer = word_level_tokenizer(PP_CHART2TABLE_TOKENS)
    processor = transformers.PPChart2TableProcessor(
        image_processor=PPChart2TableImageProcessorPil(size={"height": 56, "width": 56}), tokenizer=tokenizer)
    return processor, config_with_ids("pp_chart2table", tokenizer, {"image_token_index": "<imgpad>"})


def pp_chart2table_calls(processor, rng):
    """Two charts, each prompt written as the chat template writes it: the image's tokens (one per
    feature of the tiny vision tower) then the words."""
    return [{"images": [random_image(rng, 56, 56)], "text": [f"<img><imgpad></img> {filler_text(rng, count)}"],
             "return_tensors": "pt"} for count in (5, 2)]




def image_calls(processor, rng):
    """Two samples with an image each, of 28 pixels (the processor places the image's tokens)."""
    return [{"images": [random_image(rng, 28, 28)], "text": [filler_text(rng, count)], "return_tensors": "pt"}
            for count in (5, 2)]


# -- InstructBLIP ----------------------------------------------------------------------------------

#: The Q-Former's queries, each an image token the processor puts before the text
QUERY_TOKENS = 4


def instructblipvideo():
    """Its processor around a stand-in video processor (the real one needs torchvision)."""
    import transformers

    from mmrope_core.tiny import processors_without_torchvision

    tokenizer = word_level_tokenizer({"bos_token": "</s>"})  # the processor adds its video token
    qformer_tokenizer = word_level_tokenizer({"cls_token": "[CLS]", "sep_token": "[SEP]"})
    with processors_without_torchvision() as placeholder:
        processor = transformers.InstructBlipVideoProcessor(
            video_processor=video_processor_stand_in(type(placeholder)), tokenizer=tokenizer,
            qformer_tokenizer=qformer_tokenizer, num_query_tokens=QUERY_TOKENS)
    return processor, config_with_ids("instructblipvideo", tokenizer, {"video_token_index": "<video>"})


def video_processor_stand_in(base):
    """InstructBLIP-Video's video processor where torchvision is missing: each video's frames as
    the real one outputs them at their own size (rescaled, normalized by CLIP's mean and std), the
    batch's ``pixel_values`` ``(videos, frames, 3, height, width)``."""
    import numpy as np
    import torch
    from transformers.feature_extraction_utils import BatchFeature
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    class StandIn(base):
        model_input_names: ClassVar[list[str]] = ["pixel_values"]

        def __call__(self, videos, **kwargs):
            mean, std = np.array(OPENAI_CLIP_MEAN), np.array(OPENAI_CLIP_STD)
            frames = [(np.asarray(video, dtype=np.float32) / 255 - mean) / std for video in videos]
            pixels = torch.tensor(np.stack(frames), dtype=torch.float32).permute(0, 1, 4, 2, 3)
            return BatchFeature({"pixel_values": pixels.contiguous()})

    return StandIn()


def video_calls(processor, rng):
    """Two samples with a video each: 4 frames of 28 pixels (the model's 4 frames a video)."""
    import numpy as np

    generator = np.random.default_rng(rng.randint(0, 2**31))
    return [{"images": [generator.integers(0, 256, (4, 28, 28, 3), dtype=np.uint8)], "text": [filler_text(rng, count)],
             "return_tensors": "pt"} for count in (5, 2)]


def instructblip():
    import transformers
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    tokenizer = word_level_tokenizer({"bos_token": "</s>"})  # the processor adds its image token
    qformer_tokenizer = word_level_tokenizer({"cls_token": "[CLS]", "sep_token": "[SEP]"})
    processor = transformers.InstructBlipProcessor(
        image_processor=BlipImageProcessorPil(size={"height": 28, "width": 28}), tokenizer=tokenizer,
        qformer_tokenizer=qformer_tokenizer, num_query_tokens=QUERY_TOKENS)
    return processor, config_with_ids("instructblip", tokenizer, {"image_token_index": "<image>"})


# -- audio-language models -------------------------------------------------------------------------

#: ``(name, model type, processor class, the processor's audio tokens, sampling rate, overrides)``: each
#: built from its own feature extractor and a word-level tokenizer holding the tokens.
AUDIO = (
    ("MOSS-Transcribe-Diarize", "moss_transcribe_diarize", "MossTranscribeDiarizeProcessor",
     {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}, 16000,
     ()),
    # its wav2vec2 feature encoder's channels and positional convolution, which the sizes do not name
    ("OmniASR", "omniasr", "OmniASRProcessor", {"audio_token": "<extra_id_1>"}, 16000,
     (("audio_config.conv_dim", [32] * 7), ("audio_config.num_conv_pos_embeddings", 16),
      ("audio_config.num_conv_pos_embedding_groups", 2))),
    # the noise its forward adds to the acoustic latents (a sigma-VAE's, drawn per call) set to none:
    # a sample's logits are then the same at every call; its encoders' blocks and channels, which
    # the sizes do not name (their downsampling kept: the processor's 3200 samples a token)
    ("VibeVoice-ASR", "vibevoice_asr", "VibeVoiceAsrProcessor",
     {"audio_token": "<|box_start|>", "audio_bos_token": "<|object_ref_start|>",
      "audio_eos_token": "<|object_ref_end|>", "audio_duration_token": "<|AUDIO_DURATION|>"}, 24000,
     (("acoustic_tokenizer_encoder_config.vae_std", 0.0),
      *((f"{encoder}_tokenizer_encoder_config.{key}", value) for encoder in ("acoustic", "semantic")
        for key, value in (("depths", [1] * 7), ("num_filters", 2))))),
    # sizes the tiny sizes do not name: the diarization head's input (its encoder's width), the
    # Mamba layers' heads and state, the shared expert; its audio encoders' attention has a key and
    # value head per query head
    ("Nemotron-3.5-Transcribe", "nemo_speechlm", "Nemotron3_5TranscribeProcessor", {"audio_token": "<|audio|>"}, 16000,
     (("audio_config.asr_config.num_key_value_heads", 2),
      ("audio_config.diarization_config.audio_config.num_key_value_heads", 2),
      ("audio_config.diarization_config.head_config.audio_hidden_size", 32),
      ("audio_config.diarization_config.head_config.hidden_size", 32),
      ("text_config.mamba_num_heads", 4), ("text_config.mamba_head_dim", 16), ("text_config.ssm_state_size", 16),
      ("text_config.n_groups", 1), ("text_config.moe_shared_expert_intermediate_size", 64))),
)
#: Further parts of a processor: word-level tokenizers too (Nemotron's word-timestamp vocabulary,
#: which no call here reads).
PARTS = {"nemo_speechlm": ("alignment_tokenizer",)}


def audio_model(model_type, processor_class, tokens):
    import transformers
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

    tokenizer = word_level_tokenizer({**tokens, "bos_token": "<s>"})
    extractor = getattr(transformers, FEATURE_EXTRACTOR_MAPPING_NAMES[model_type])()
    parts = {name: word_level_tokenizer({}) for name in PARTS.get(model_type, ())}
    processor = getattr(transformers, processor_class)(feature_extractor=extractor, tokenizer=tokenizer, **parts,
                                                       **tokens)
    return processor, config_with_ids(model_type, tokenizer, {"audio_token_id": tokens["audio_token"]})


def audio_calls(processor, rng, rate=16000):
    """Two samples with an audio clip each, of 1 and 2 seconds, the clip's token where the text has it."""
    import numpy as np

    return [{"text": [f"{filler_text(rng, 2)} {processor.audio_token} {filler_text(rng, 3)}"],
             "audio": [np.sin(np.arange(rate * seconds) / rng.uniform(5, 40)).astype(np.float32)],
             "return_tensors": "pt"} for seconds in (1, 2)]


# -- UDOP ------------------------------------------------------------------------------------------


def udop():
    """UDOP's processor: its own tokenizer class over a word-level vocabulary, words and their
    boxes given (no OCR), and its default config holding the tokenizer's ids."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers.models.layoutlmv3.image_processing_pil_layoutlmv3 import LayoutLMv3ImageProcessorPil

    from mmrope_core.tiny import FILLER_WORDS

    specials = ["<pad>", "</s>", "<unk>"]
    vocabulary = {token: index for index, token in enumerate([*specials, *dict.fromkeys(FILLER_WORDS)])}
    words = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.UdopTokenizer(tokenizer_object=words, pad_token="<pad>", eos_token="</s>",
                                           unk_token="<unk>")
    processor = transformers.UdopProcessor(
        image_processor=LayoutLMv3ImageProcessorPil(apply_ocr=False, size={"height": 28, "width": 28}),
        tokenizer=tokenizer)
    return processor, transformers.AutoConfig.for_model("udop")


def udop_calls(processor, rng):
    """Two pages of 28 pixels, with 5 and 2 words and their boxes."""
    from mmrope_core.tiny import FILLER_WORDS

    calls = []
    for count in (5, 2):
        words = [rng.choice(FILLER_WORDS) for _ in range(count)]
        calls.append({"images": [random_image(rng, 28, 28)], "text": [words],
                      "boxes": [[[rng.randint(0, 500)] * 4 for _ in words]], "return_tensors": "pt"})
    return calls
