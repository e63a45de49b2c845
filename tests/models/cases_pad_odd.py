"""More bound model types for the model-level collator tests (see test_padded_batches.py):
``extra_cases()`` gives each as ``name -> (build() -> (processor, config), calls(processor, rng),
overrides of the default config)``, built with the real processor classes.

One stand-in: ``PixtralProcessor`` (Mistral-Large-4's, and Mistral3's, whose text model the
Mistral4 case runs) needs torchvision, which the tests run without; LightOnOCR's processor, as for Mistral3, places Pixtral's tokens by the same rule (rows
of ``[IMG]`` ending in ``[IMG_BREAK]``, the last ``[IMG_END]``) over the same Pillow image processor.
"""

from __future__ import annotations

import functools


def extra_cases():
    from test_padded_batches import build_setting

    from mmrope_transformers.examples import samples
    from mmrope_transformers.specs import available

    found = {}
    for spec, overrides in specs():
        if available(spec):
            found[spec.name] = (functools.partial(build_setting, spec, {}), functools.partial(samples, spec), overrides)
    return found


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
        # Q-Former takes a head per 64 vision widths
        (Spec("Granite-4-Vision (granite4_vision)", "granite4_vision", "Granite4VisionProcessor",
              ("llava_next", "LlavaNextImageProcessorPil", {**_LLAVA_IMAGE_PROCESSOR, "image_grid_pinpoints": _PINPOINTS}),
              {"image_token": "<image>"}, {"image_token_index": "<image>"},
              processor_kwargs={"patch_size": 14, "vision_feature_select_strategy": "default",
                                "num_additional_image_tokens": 1, "downsample_rate": "1/2"}),
         (("text_config.num_hidden_layers", 5), ("deepstack_layer_map", [[1, 0]]),
          ("spatial_target_layers", [1, 2, 3, 4]), ("downsample_rate", "1/2"),
          ("vision_config.hidden_size", 64))),
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
