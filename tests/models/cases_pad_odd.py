"""More bound model types for the model-level collator tests (see test_padded_batches.py):
``extra_cases()`` gives each as ``name -> (build() -> (processor, config), calls(processor, rng),
overrides of the default config)``, built with the real processor classes.

Two stand-ins, for packages the tests run without. ``PixtralProcessor`` (Mistral-Large-4's, and
Mistral3's, whose text model the Mistral4 case runs) needs torchvision: LightOnOCR's processor, as
for Mistral3, places Pixtral's tokens by the same rule (rows of ``[IMG]`` ending in
``[IMG_BREAK]``, the last ``[IMG_END]``) over the same Pillow image processor. Granite Speech's
real feature extractor computes its mel spectrogram with torchaudio: :class:`MelSpectrogram`
computes the same one in torch, so the features keep their keys, shapes and tokens per clip.
"""

from __future__ import annotations

import functools
import types

import torch


def extra_cases():
    import transformers
    from test_padded_batches import build_setting

    from mmrope_transformers.examples import samples
    from mmrope_transformers.specs import available

    found = {}
    for spec, overrides in specs():
        if available(spec):
            found[spec.name] = (functools.partial(build_setting, spec, {}), functools.partial(samples, spec), overrides)
    for model_type in ("granite_speech", "granite_speech_plus"):
        if model_type in transformers.CONFIG_MAPPING:
            found[f"Granite Speech{' Plus' if model_type.endswith('plus') else ''} ({model_type})"] = (
                functools.partial(granite_speech, model_type), same_length_clips, GRANITE_SPEECH)
    return found


#: The encoder's sizes (names of its own), tiny
GRANITE_SPEECH = (("encoder_config.num_layers", 2), ("encoder_config.hidden_dim", 32), ("encoder_config.dim_head", 16),
                  ("projector_config.encoder_hidden_size", 32))


PIXTRAL_TOKENS = {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}


def specs():
    """Specs of the model types built from a Pillow image processor, and the config values
    (dotted paths) that their tiny models need beyond the tests' tiny sizes."""
    from mmrope_transformers.specs import _GLM_IMAGE, _LLAVA_IMAGE_PROCESSOR, _PINPOINTS, GLM_IDS, GLM_TOKENS, Spec

    return (
        # its config takes as many key-value heads as query heads, NoPE attention layers (no
        # rotary dimensions) and a top-k that is a multiple of the indexer's pool
        (Spec("GLM-5-Next (glm5_next)", "glm5_next", "Glm5NextProcessor",
              ("glm5_next", "Glm5NextImageProcessorPil", {}), GLM_TOKENS, GLM_IDS, _GLM_IMAGE, video_processor=True),
         (("text_config.num_key_value_heads", 2), ("text_config.qk_rope_head_dim", 0),
          ("text_config.index_kpool", 4), ("text_config.linear_num_heads", 2), ("text_config.linear_head_dim", 8),
          ("vision_config.projection_intermediate_size", 64))),
        # its default config maps no vision layer to a text layer (deepstack_layer_map), which its
        # projectors need, and puts its four spatial groups past the tiny text model's layers; the
        # Q-Former (a head per 64 widths) reads the vision width. Its own text config and a SigLIP
        # tower (every patch a feature) stated: the defaults differ between transformers releases
        (Spec("Granite-4-Vision (granite4_vision)", "granite4_vision", "Granite4VisionProcessor",
              ("llava_next", "LlavaNextImageProcessorPil", {**_LLAVA_IMAGE_PROCESSOR, "image_grid_pinpoints": _PINPOINTS}),
              {"image_token": "<image>"}, {"image_token_index": "<image>"},
              config_kwargs={"text_config": {"model_type": "granite4_vision_text"},
                             "vision_config": {"model_type": "siglip_vision_model"},
                             "vision_feature_select_strategy": "full"},
              processor_kwargs={"patch_size": 14, "vision_feature_select_strategy": "full",
                                "num_additional_image_tokens": 0, "downsample_rate": "1/2"}),
         (("text_config.num_hidden_layers", 5), ("deepstack_layer_map", [[1, 0]]),
          ("spatial_target_layers", [1, 2, 3, 4]), ("downsample_rate", "1/2"),
          ("vision_config.hidden_size", 64), ("qformer_config.hidden_size", 64),
          ("qformer_config.encoder_hidden_size", 64), ("qformer_config.num_attention_heads", 1))),
        # the Mistral3 stand-in's processor (see test_padded_batches.py); an MLA model, as many
        # key-value heads as query heads. Every sample no longer than index_topk: the indexer keeps
        # all of a sample's keys, packed or alone (past it, keys it scores alike, a ReLU's zeros,
        # are told apart by their slot in the row: packed rows of such samples are refused)
        (Spec("Mistral-Large-4 (mistral_large4)", "mistral_large4", "LightOnOcrProcessor",
              ("pixtral", "PixtralImageProcessorPil", {"size": {"longest_edge": 56}, "patch_size": 14}),
              PIXTRAL_TOKENS, {"image_token_index": "[IMG]"},
              processor_kwargs={"patch_size": 14, "spatial_merge_size": 2}, sizes=(1, 2, 28)),
         (("vision_config.patch_size", 14), ("spatial_merge_size", 2), ("text_config.num_key_value_heads", 2),
          ("text_config.index_topk", 16))),
        # mistral4 is a text config: its model runs as Mistral3's text model, fed by the same stand-in
        (Spec("Mistral3 with Mistral4 text (mistral4)", "mistral3", "LightOnOcrProcessor",
              ("pixtral", "PixtralImageProcessorPil", {"size": {"longest_edge": 56}, "patch_size": 14}),
              PIXTRAL_TOKENS, {"image_token_index": "[IMG]"}, config_kwargs={"text_config": {"model_type": "mistral4"}},
              processor_kwargs={"patch_size": 14, "spatial_merge_size": 2}, sizes=(1, 2, 28)),
         (("vision_config.patch_size", 14), ("spatial_merge_size", 2), ("text_config.num_key_value_heads", 2))),
        # the real Kosmos2Processor (no auto mapping names it; the checkpoints ship it): it writes
        # each sample's image placeholders itself, latent_query_num of them
        (Spec("Kosmos-2 (kosmos-2)", "kosmos-2", "Kosmos2Processor",
              ("clip", "CLIPImageProcessorPil", {"size": {"shortest_edge": 28}, "crop_size": {"height": 28, "width": 28}}),
              {"bos_token": "<s>", "eos_token": "</s>"}, image_text="", counts=(1, 1),
              call_kwargs={"num_image_tokens": 4}),
         (("latent_query_num", 4), ("text_config.layers", 2), ("text_config.ffn_dim", 64))),
        # the real Kosmos2_5Processor (no auto mapping names it): each sample one image, a prompt of
        # latent_query_num image places the processor writes; flattened 16-pixel patches, at most 16
        (Spec("Kosmos-2.5 (kosmos-2.5)", "kosmos-2.5", "Kosmos2_5Processor",
              ("kosmos2_5", "Kosmos2_5ImageProcessorPil", {"max_patches": 16}),
              {"bos_token": "<s>", "eos_token": "</s>", "boi_token": "<image>", "eoi_token": "</image>",
               "image_token": "<s>"}, image_text="", counts=(1, 1), processor_kwargs={"num_image_tokens": 4},
              call_kwargs={"max_patches": 16}),
         (("latent_query_num", 4), ("text_config.layers", 2), ("text_config.ffn_dim", 64))),
    )


# -- Granite Speech: torchaudio's mel spectrogram stood in ---------------------------------------


class MelSpectrogram(torch.nn.Module):
    """Stands in for ``torchaudio.transforms.MelSpectrogram`` with the arguments Granite Speech's
    feature extractor gives it (power 2, centred reflect-padded frames, a periodic Hann window,
    HTK mel filters without norm): the same ``(..., n_mels, frames)`` power spectrogram."""

    def __init__(self, sample_rate, n_fft, win_length, hop_length, n_mels):
        super().__init__()
        self.n_fft, self.win_length, self.hop_length = n_fft, win_length, hop_length
        self.register_buffer("window", torch.hann_window(win_length))
        self.register_buffer("filters", mel_filters(n_fft // 2 + 1, n_mels, sample_rate))

    def forward(self, audio):
        spectrum = torch.stft(audio, self.n_fft, self.hop_length, self.win_length, self.window, center=True,
                              pad_mode="reflect", return_complex=True).abs().pow(2)
        return (spectrum.transpose(-1, -2) @ self.filters).transpose(-1, -2)


def mel_filters(frequencies, n_mels, sample_rate):
    """Triangular filters on the HTK mel scale, ``(frequencies, n_mels)``."""
    def mel(hz):
        return 2595.0 * torch.log10(1.0 + hz / 700.0)

    hz = torch.linspace(0, sample_rate // 2, frequencies)
    edges = 700.0 * (10 ** (torch.linspace(0.0, float(mel(torch.tensor(sample_rate / 2))), n_mels + 2) / 2595.0) - 1.0)
    widths = edges[1:] - edges[:-1]
    slopes = edges[None, :] - hz[:, None]
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    return torch.clamp(torch.minimum(rising, falling), min=0.0)


def same_length_clips(processor, rng, seconds=(1, 1)):
    """Two samples with a clip each, of ``seconds``: the collators refuse clips of different
    lengths in one batch (the encoder reads a shorter clip's padding)."""
    import numpy as np

    from mmrope_core.tiny import filler_text

    return [{"text": [f"{filler_text(rng, words)} <|audio|> {filler_text(rng, 3)}"],
             "audio": [np.sin(np.arange(16000 * length) / rng.uniform(5, 40)).astype(np.float32)],
             "return_tensors": "pt"} for words, length in zip((2, 6), seconds)]


def install_torchaudio_stand_in():
    """Granite Speech's feature extractor with :class:`MelSpectrogram` in place of torchaudio's,
    where torchaudio is missing: its module's names, for the rest of the process."""
    from transformers.models.granite_speech import feature_extraction_granite_speech as module
    from transformers.utils.import_utils import is_torchaudio_available, requires_backends

    if is_torchaudio_available() or getattr(module, "torchaudio", None) is not None:
        return

    def without_torchaudio(owner, backends):
        requires_backends(owner, [backend for backend in backends if backend != "torchaudio"])

    module.torchaudio = types.SimpleNamespace(transforms=types.SimpleNamespace(MelSpectrogram=MelSpectrogram))
    module.requires_backends = without_torchaudio


def granite_speech(model_type):
    import transformers
    from transformers.models.granite_speech.feature_extraction_granite_speech import GraniteSpeechFeatureExtractor

    from mmrope_core.tiny import word_level_tokenizer

    install_torchaudio_stand_in()
    tokenizer = word_level_tokenizer({"audio_token": "<|audio|>"})
    processor = transformers.GraniteSpeechProcessor(GraniteSpeechFeatureExtractor(), tokenizer)
    config = transformers.AutoConfig.for_model(model_type)
    config.audio_token_id = tokenizer.convert_tokens_to_ids("<|audio|>")
    return processor, config
