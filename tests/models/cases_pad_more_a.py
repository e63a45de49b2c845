"""More model types for the model-level collator tests (test_padded_batches.py, test_packed_rows.py),
each with its real processor built in code and its tiny config fitted to it: Chameleon and Emu3
(tiny VQ encoders whose codes the word-level vocabulary names as the checkpoints' vocabularies
do), BLIP, BLIP-2, IDEFICS, Fuyu, DeepSeek-OCR-2, dots3.note (images) and Fun-ASR-Nano (audio);
and Florence-2, an encoder-decoder that test_encoder_decoder_batches.py runs.

Two stand-ins, for parts that need what the tests run without, each keeping the real one's keys,
shapes and tokens: Fuyu's image processor is its Pillow one converting the tensors transformers
5.24's processor hands its ``patchify_image`` (which takes arrays; the torchvision one, which takes
tensors, needs torchvision), and Fun-ASR-Nano's feature extractor is its own with the Kaldi
filterbank it computes with torchaudio computed with torch, on the same frames and mel bins.
"""

from __future__ import annotations

import functools
import re

#: Chameleon's VQ codes as its vocabulary names them (``IMGIMG`` + the code in letters A-J + ``Z``).
CHAMELEON_CODES = tuple(f"IMGIMG{letter}Z" for letter in "ABCD")


#: Emu3's VQ codes as its vocabulary names them, and the end of a row of codes.
EMU3_CODES = tuple(f"<|visual token {code:06d}|>" for code in range(4))


def dots3_note_spec():
    """dots3.note's processor over Qwen2-VL's image processor, with its own audio feature extractor."""
    import transformers

    from mmrope_transformers.specs import _QWEN_IMAGE, Spec

    # one frame a patch: its vision tower embeds 3 x 14 x 14 values a patch
    return Spec("dots3.note (dots3_note)", "dots3_note", "Dots3NoteProcessor",
                ("qwen2_vl", "Qwen2VLImageProcessorPil", {"temporal_patch_size": 1}),
                {"image_token": "<|imgpad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_comp_pad|>",
                 "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"},
                {"image_token_id": "<|imgpad|>", "video_token_id": "<|video_pad|>",
                 "audio_token_id": "<|audio_comp_pad|>"}, _QWEN_IMAGE, video_processor=True,
                processor_kwargs={"feature_extractor": transformers.Dots3NoteFeatureExtractor()})


def extra_cases():
    import transformers
    from test_padded_batches import audio_calls

    from mmrope_transformers.examples import build, samples

    found = {}
    if "chameleon" in transformers.CONFIG_MAPPING:
        # a VQ encoder of 4 codes that turns a 16-pixel image into 2x2 codes: 4 tokens an image
        found["Chameleon (chameleon)"] = (chameleon, functools.partial(image_calls, side=16, image_text="<image> "), (
            ("vq_config.resolution", 16), ("vq_config.channel_multiplier", [1, 1, 1, 1]),
            ("vq_config.num_embeddings", len(CHAMELEON_CODES)), ("vq_config.base_channels", 32),
            ("vq_config.num_res_blocks", 1)))
    if "blip-2" in transformers.CONFIG_MAPPING:  # patches that tile its 28-pixel images, 4 query tokens
        found["BLIP-2 (blip-2)"] = (blip_2, image_calls, (("vision_config.patch_size", 14),
                                                          ("vision_config.image_size", 28), ("num_query_tokens", 4),
                                                          ("text_config.word_embed_proj_dim", 32)))
    if "blip" in transformers.CONFIG_MAPPING:  # its text decoder's loss without the checkpoints' label smoothing
        found["BLIP (blip)"] = (blip, image_calls, (("vision_config.patch_size", 14), ("vision_config.image_size", 28),
                                                    ("text_config.label_smoothing", 0.0)))
    if "idefics" in transformers.CONFIG_MAPPING:  # patches that tile its 28-pixel images
        found["IDEFICS (idefics)"] = (idefics, functools.partial(image_calls, nested=True), (
            ("vision_config.patch_size", 14), ("vision_config.image_size", 28)))
    if "emu3" in transformers.CONFIG_MAPPING:
        # a VQ encoder of 4 codes and the processor's 8-fold downsampling: images of 16x16 and 16x24
        # pixels become 2x2 and 2x3 codes, a row's end after each row of codes
        found["Emu3 (emu3)"] = (emu3, functools.partial(image_calls, sizes=[(16, 16), (16, 24)], image_text="<image> "), (
            ("vq_config.channel_multiplier", [1, 1, 1, 1]), ("vq_config.codebook_size", len(EMU3_CODES)),
            ("vq_config.base_channels", 32), ("vq_config.num_res_blocks", 1), ("vq_config.embed_dim", 4),
            ("vq_config.latent_channels", 4)))
    if "fuyu" in transformers.CONFIG_MAPPING:  # 14-pixel patches: 2x2 an image, each row ending in a newline
        found["Fuyu (fuyu)"] = (fuyu, image_calls, (("patch_size", 14), ("image_size", 28)))
    if "dots3_note" in transformers.CONFIG_MAPPING:  # the adapters' widths follow the tiny towers'
        spec = dots3_note_spec()
        found[spec.name] = (functools.partial(build, spec), functools.partial(samples, spec), (
            ("vision_config.adapter_in_dim", 32), ("vision_config.adapter_out_dim", 32),
            ("audio_config.adapter_input_size", 32), ("audio_config.adapter_out_dim", 32),
            # its attention takes as many key-value heads as query heads, its sliding layers' head
            # the sum of their rotary and other parts
            ("text_config.num_key_value_heads", 2),
            ("text_config.per_layer_config", {"2": {"num_attention_heads": 2, "num_key_value_heads": 2,
                                                    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "head_dim": 32}}),
            ("vision_config.per_layer_config", {"1": {"num_local_experts": 4}})))  # its vision experts: 2 routed
    if "deepseek_ocr2" in transformers.CONFIG_MAPPING:
        # 768-pixel global views (its vision tower's queries are sized for 768 or 1024 pixels: 144
        # tokens an image), a narrow SAM encoder (its MLP width is no size the tiny config shrinks)
        found["DeepSeek-OCR-2 (deepseek_ocr2)"] = (deepseek_ocr2, functools.partial(image_calls, side=56,
                                                                                  image_text="<image> "), (
            ("vision_config.sam_config.image_size", 768), ("vision_config.sam_config.mlp_dim", 64),
            ("vision_config.sam_config.downsample_channels", [32, 32]), ("vision_config.sam_config.output_channels", 32),
            # the checkpoint's layers (the default config names none): a dense one, then experts, 2 a token
            ("text_config.mlp_layer_types", ["dense", "sparse"]), ("text_config.num_experts_per_tok", 2)))
    if "fun_asr_nano" in transformers.CONFIG_MAPPING:  # an audio token per frame of its features
        found["Fun-ASR-Nano (fun_asr_nano)"] = (fun_asr_nano, functools.partial(audio_calls,
                                                                                audio_text="<|object_ref_start|>"),
                                                       (("adaptor_config.intermediate_size", 8),))  # a quarter of 32
    return found


def image_calls(processor, rng, side=28, image_text="", nested=False, sizes=None):
    """Two samples with an image each, of ``side`` pixels (or ``sizes``, (height, width) each),
    ``image_text`` where the text places it (``nested``: each sample's images in a list of their own)."""
    from mmrope_core.tiny import filler_text, random_image

    calls = []
    for count, (height, width) in zip((4, 2), sizes or [(side, side)] * 2):
        image = random_image(rng, height, width)
        calls.append({"text": [f"{image_text}{filler_text(rng, count)}".strip()],
                      "images": [[image]] if nested else [image], "return_tensors": "pt"})
    return calls


def chameleon():
    import transformers
    from transformers.models.chameleon.image_processing_pil_chameleon import ChameleonImageProcessorPil

    from mmrope_core.tiny import FILLER_WORDS, word_level_tokenizer

    tokenizer = word_level_tokenizer({"image_token": "<image>", "boi_token": "<racm3:break>", "eoi_token": "<eoss>",
                                      "sep_token": "<reserved08706>"}, words=(*FILLER_WORDS, *CHAMELEON_CODES))
    image_processor = ChameleonImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = transformers.ChameleonProcessor(image_processor, tokenizer, image_seq_length=4)
    config = transformers.AutoConfig.for_model("chameleon", vocabulary_map=tokenizer.get_vocab())
    return processor, config


def blip_2():
    import transformers
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"bos_token": "</s>"})
    image_processor = BlipImageProcessorPil(size={"height": 28, "width": 28})
    # the checkpoints' tokenizer has no image token: the processor adds it
    processor = transformers.Blip2Processor(image_processor, tokenizer, num_query_tokens=4)
    config = transformers.AutoConfig.for_model("blip-2", num_query_tokens=4)
    config.image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    return processor, config


def blip():
    """The processor writes no image tokens: the model's text decoder attends to its row's image."""
    import transformers
    from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"bos_token": "[DEC]", "sep_token": "[SEP]"})
    processor = transformers.BlipProcessor(BlipImageProcessorPil(size={"height": 28, "width": 28}), tokenizer)
    config = transformers.AutoConfig.for_model("blip")
    return processor, config


def idefics():
    """Its processor writes each image's tokens itself, from the images given after the text."""
    import transformers
    from transformers.models.idefics.image_processing_pil_idefics import IdeficsImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"bos_token": "<s>", "eos_token": "</s>", "image_token": "<image>",
                                      "fake_image_token": "<fake_token_around_image>",
                                      "end_of_utterance_token": "<end_of_utterance>"})
    processor = transformers.IdeficsProcessor(IdeficsImageProcessorPil(image_size=28), tokenizer)
    config = transformers.AutoConfig.for_model("idefics")
    return processor, config


def emu3():
    import transformers
    from transformers.models.emu3.image_processing_emu3 import Emu3ImageProcessor

    from mmrope_core.tiny import FILLER_WORDS, word_level_tokenizer

    tokenizer = word_level_tokenizer({"image_token": "<image>", "boi_token": "<|image start|>",
                                      "eoi_token": "<|image end|>", "image_wrapper_token": "<|image token|>",
                                      "eof_token": "<|extra_201|>", "bos_token": "<|extra_203|>",
                                      "eol_token": "<|extra_200|>"}, words=(*FILLER_WORDS, "2*2", "2*3", *EMU3_CODES))
    # Pillow only (its module imports no torchvision): sides of multiples of its 8-pixel factor, kept
    image_processor = Emu3ImageProcessor(min_pixels=16 * 16, max_pixels=16 * 24)
    processor = transformers.Emu3Processor(image_processor, tokenizer)
    config = transformers.AutoConfig.for_model("emu3", vocabulary_map=tokenizer.get_vocab())
    return processor, config


def fuyu():
    """Its processor with a stand-in image processor: the Pillow one, whose ``patchify_image`` takes
    the tensors transformers 5.24's processor hands it (the torchvision one, which takes tensors,
    needs torchvision): the same patches, as tensors."""
    import torch
    import transformers
    from transformers.models.fuyu.image_processing_pil_fuyu import FuyuImageProcessorPil

    class TensorPatchesFuyuImageProcessor(FuyuImageProcessorPil):
        def patchify_image(self, image, patch_size=None):  # the same patches, a tensor in and out
            if not isinstance(image, torch.Tensor):  # transformers 5.10's processor hands it arrays
                return super().patchify_image(image, patch_size)
            return torch.from_numpy(super().patchify_image(image.numpy(), patch_size))

    tokenizer = fuyu_tokenizer()
    image_processor = TensorPatchesFuyuImageProcessor(size={"height": 28, "width": 28},
                                                      patch_size={"height": 14, "width": 14})
    processor = transformers.FuyuProcessor(image_processor, tokenizer)
    config = transformers.AutoConfig.for_model("fuyu")
    config.image_token_id = tokenizer.convert_tokens_to_ids("|SPEAKER|")
    return processor, config


def fuyu_tokenizer():
    """A word-level tokenizer that starts every text with ``▁``, as the checkpoint's SentencePiece
    tokenizer does: the processor strips that first token off the image's placeholder tokens."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from mmrope_core.tiny import FILLER_WORDS

    # the image's tokens, the answer's start and the text's end (transformers 5.10's processor reads them)
    specials = ["|SPEAKER|", "|NEWLINE|", "<s>", "<0x04>", "|ENDOFTEXT|"]
    words = ["<pad>", "[UNK]", "▁", *specials, *FILLER_WORDS]
    model = Tokenizer(models.WordLevel(vocab={word: index for index, word in enumerate(words)}, unk_token="[UNK]"))
    model.normalizer = normalizers.Prepend("▁ ")
    model.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("|".join(map(re.escape, specials))), behavior="isolated"),
        pre_tokenizers.WhitespaceSplit()])
    return PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", unk_token="[UNK]", bos_token="<s>")


def deepseek_ocr2():
    """Images no larger than its tiles: one global view each, no local crops."""
    import transformers
    from transformers.models.deepseek_ocr2.image_processing_pil_deepseek_ocr2 import DeepseekOcr2ImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"image_token": "<image>"})
    image_processor = DeepseekOcr2ImageProcessorPil(size={"height": 768, "width": 768}, tile_size=768)
    processor = transformers.DeepseekOcr2Processor(image_processor, tokenizer)
    config = transformers.AutoConfig.for_model("deepseek_ocr2")
    config.image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    return processor, config


def fun_asr_nano():
    """Its processor with a stand-in feature extractor: its own, whose Kaldi filterbank (computed
    with torchaudio, which the tests run without) is replaced by one of the same frames and bins
    computed with torch (:class:`KaldiShapedFeatures`); the frame stacking, padding and mask are its own."""
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"audio_token": "<|object_ref_start|>"})
    processor = transformers.FunAsrNanoProcessor(kaldi_shaped_features(), tokenizer)
    config = transformers.AutoConfig.for_model("fun_asr_nano")
    config.audio_token_id = tokenizer.convert_tokens_to_ids("<|object_ref_start|>")
    return processor, config


def kaldi_shaped_features():
    """Fun-ASR-Nano's feature extractor, its filterbank computed as Kaldi frames it (25 ms windows every
    10 ms, no frame past the clip's end): log mel energies of Hamming-windowed frames."""
    import numpy as np
    import torch
    from transformers.audio_utils import mel_filter_bank
    from transformers.models.fun_asr_nano.feature_extraction_fun_asr_nano import FunAsrNanoFeatureExtractor

    class KaldiShapedFeatures(FunAsrNanoFeatureExtractor):
        def _extract_fbank_features(self, waveform):
            window = self.sampling_rate * self.frame_length // 1000
            shift = self.sampling_rate * self.frame_shift // 1000
            frames = waveform.float().unfold(0, window, shift)  # 1 + (samples - window) // shift frames
            frames = (frames - frames.mean(-1, keepdim=True)) * torch.hamming_window(window, periodic=False)
            power = torch.fft.rfft(frames, n=512).abs() ** 2
            mel = torch.from_numpy(mel_filter_bank(257, self.feature_size, 20.0, self.sampling_rate / 2,
                                                   self.sampling_rate, mel_scale="kaldi").astype(np.float32))
            return torch.log(torch.clamp(power @ mel, min=1e-10))

    return KaldiShapedFeatures()


def florence2():
    """Florence-2's processor over CLIP's Pillow image processor: 64-pixel images, which its tiny
    DaViT tower turns into 2x2 features and their mean, 5 tokens an image. An encoder-decoder, run
    by a test of its own (test_encoder_decoder_batches.py), not by the padded-batch test's cases."""
    import transformers
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"image_token": "<image>", "bos_token": "<s>", "eos_token": "</s>"})
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})
    image_processor.image_seq_length = 5  # what the processor reads: tokens per image
    processor = transformers.Florence2Processor(image_processor, tokenizer)
    config = transformers.AutoConfig.for_model("florence2")
    config.image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    return processor, config


#: Florence-2's tiny DaViT tower: one block a stage (the default's third stage has nine).
FLORENCE2_OVERRIDES = (("vision_config.depths", [1, 1, 1, 1]),)
