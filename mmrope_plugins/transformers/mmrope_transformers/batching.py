"""How each bound model takes a batch: the media its processor batches in its own way, the padding
side its layers get wrong, the rows of positions it reads (see :mod:`mmrope_core.batching`).

What a processor's batched call does otherwise than concatenating every key on dim 0 is stated
per model type below, each checked against the processor's own batched call by the tests; what
follows from the config (its layers, an encoder-decoder) or the processor (no placeholder
tokens) is read from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmrope_core.batching import BatchLayout, MediaKey, first_item_slot

from .reference import media_token_ids

_STRIP = MediaKey(join="last")
#: Mllama: every sample gets a row of the batch's most images (and tiles), its cross-attention
#: mask one entry per token, padded as the ids are
_MLLAMA = {
    "pixel_values": MediaKey(items_dim=1),
    "aspect_ratio_ids": MediaKey(items_dim=1),
    "aspect_ratio_mask": MediaKey(items_dim=1, empty_item=first_item_slot),
    "cross_attention_mask": MediaKey(items_dim=2, token_dim=1),
}

#: IDEFICS: every sample gets a row of the batch's most images, its image attention mask one entry
#: per token, padded as the ids are
_IDEFICS = {"pixel_values": MediaKey(items_dim=1), "image_attention_mask": MediaKey(items_dim=2, token_dim=1)}


_PLACES_PER_TOKEN = {"image_embeds_position_mask": MediaKey(token_dim=1)}

_IMAGE_ROWS = {"pixel_values": MediaKey(items_dim=1), "pixel_attention_mask": MediaKey(items_dim=1)}

#: Why a model whose forward fills a missing attention mask with ones cannot take a packed row.
_ONES_MASK = ("its forward replaces a missing attention mask with one of ones, which hides a packed row's segments "
              "from its language model: every segment would attend to the ones before it")

_PATCHES_AFTER_PADDING = ("its encoder appends the image patches after the whole padded row, so the relative "
                          "position bias between a shorter sample's text and its patches grows with the padding "
                          "(its processor's own padded batch changes the sample too); train it one sample a batch")

#: model_type -> what its processor's batched call does otherwise, and why packed rows cannot hold it.
LAYOUTS: Mapping[str, BatchLayout] = {
    # one (1, 3, 14, W) strip per sample; the batch's strips joined into one, as the model takes them
    **dict.fromkeys(("minicpmv4_6", "minicpmv4_7", "minicpm_ocr"), BatchLayout(media={"pixel_values": _STRIP})),
    "mllama": BatchLayout(media=_MLLAMA, packing="its cross-attention mask and image rows are per batch row: "
                                                 "a packed row would let every segment's tokens see the images "
                                                 "of the row's first sample only"),
    # its pooling indices number the patches of the whole batch's crops, in one call
    "molmo2": BatchLayout(media={"image_token_pooling": MediaKey(indexes="pixel_values")}),
    # packed rows: their forward fills the attention mask with ones (IDEFICS's gated cross-attention
    # alone would keep to a block-diagonal image mask)
    "idefics": BatchLayout(media=_IDEFICS, packing=_ONES_MASK),
    "blip-2": BatchLayout(packing=_ONES_MASK),
    # every sample gets a row of the batch's most images; the model drops the all-zero ones
    # (Idefics2 and SmolVLM: the same image processor and model code as Idefics3); Granite-Docling:
    # a row of the batch's most tiles, the model taking those its pixel_attention_mask marks
    **dict.fromkeys(("idefics2", "idefics3", "smolvlm", "granite_docling"), BatchLayout(media=_IMAGE_ROWS)),
    # each image's crops padded to the batch's most, a padded crop's mask all ones (the model drops
    # the padded crops by image_sizes); its audio projection is chosen per batch: for vision where
    # the batch holds images, for speech where it does not
    "phi4_multimodal": BatchLayout(media={"image_attention_mask": MediaKey(pad_value=1),
                                          "audio_input_features": MediaKey(switched_by="image_pixel_values")}),
    # a vision-language-action model: each row's prompt is followed by its own action chunk
    "pi0": BatchLayout(packing="each batch row takes one robot state and one chunk of actions, which its action "
                               "expert predicts attending to the whole row before them: a packed row would give "
                               "all its samples one state and one chunk"),
    # the processor batches text-to-image or image-to-image samples with one source count, not a mix
    "glm_image": BatchLayout(media={"images_per_sample": MediaKey(uniform=True),
                                    "pixel_values": MediaKey(all_or_none=True)}),
    # the Q-Former reads row i's instruction beside image i: every sample holds an image (its processor
    # gives every row of a batch with images their tokens); its forward hands the language model a mask
    # of ones where it gets none, hiding a packed row's boundaries (InstructBLIP-Video: the same code)
    "instructblip": BatchLayout(media={"pixel_values": MediaKey(all_or_none=True)}, packing=_ONES_MASK),
    # InstructBLIP-Video's forward also hands position_ids on to its Q-Former, which fails on them:
    # its language model (OPT) counts them from the mask
    "instructblipvideo": BatchLayout(media={"pixel_values": MediaKey(all_or_none=True)}, takes_positions=False,
                                     packing=_ONES_MASK),
    # its encoder appends the image patches no text token covers after the whole padded row: T5's
    # relative position bias between a sample's text and those patches grows with the padding
    "udop": BatchLayout(refused_sides=dict.fromkeys(("left", "right"), _PATCHES_AFTER_PADDING)),
    # the images' places marked per token; transformers finds a packed row's segments from the
    # positions, which neither text model hands its mask
    "kosmos-2": BatchLayout(media=_PLACES_PER_TOKEN,
                            packing="its text model builds a causal mask of its own over the whole row, which lets "
                                    "each segment attend to the segments before it"),
    "kosmos-2.5": BatchLayout(media=_PLACES_PER_TOKEN,
                              packing="its text model builds its causal mask without the position ids, from which "
                                      "transformers finds a packed row's segments: each segment attends to the "
                                      "segments before it"),
    # its conformer encoder attends in blocks over every frame of the batch's longest clip, and its
    # convolutions run over them: a shorter clip's padding changes its features (no mask reaches it)
    **dict.fromkeys(("granite_speech", "granite_speech_plus"), BatchLayout(media={"input_features": MediaKey(
        one_shape="the audio encoder reads every frame of the batch's longest clip, so a shorter clip's padding "
                  "changes its features (as in the processor's own batch)")})),
    # its text decoder cross-attends each batch row's tokens to that row's protein (no placeholder
    # tokens); the processor pads protein ids with the ESM tokenizer's pad id, 1
    "evolla": BatchLayout(media={"protein_input_ids": MediaKey(per_row=True, pad_value=1),
                                 "protein_attention_mask": MediaKey(per_row=True)},
                          packing="its text decoder builds its causal mask without the position ids, from which "
                                  "transformers finds a packed row's segments, so each segment attends to the "
                                  "segments before it; and it cross-attends every token of a batch row to that row's "
                                  "one protein (the text holds no placeholder for it), so all segments would read one "
                                  "sample's protein"),
    # its text model takes exactly its xD-RoPE rows (it raises on the text row transformers 5.x
    # prepends), and without that row it cannot find a packed row's segments
    "hunyuan_vl": BatchLayout(text_positions=False,
                              packing="its text model takes only its xD-RoPE rows of positions, not the text row "
                                      "that tells transformers where a packed row's segments start"),
}


#: Model types whose text model's position embeddings count a sample's positions from
#: ``padding_idx + 1`` (the text config's ``pad_token_id + 1``), as RoBERTa's do.
POSITIONS_AFTER_PADDING_IDX = frozenset({"kosmos-2", "kosmos-2.5"})


def layout_of(processor: Any, config: Any) -> BatchLayout | None:
    """The batch layout of ``config``'s model fed by ``processor``, None for the common one."""
    model_type = str(getattr(config, "model_type", ""))
    stated = LAYOUTS.get(model_type)
    media = dict(stated.media) if stated else {}
    if not any(rule.token_dim for rule in media.values()):  # a per-token key places the images (Kosmos-2's)
        media.update(_placed_per_row(processor, config))
    refused = {**(stated.refused_sides if stated else {}), **_refused_sides(config)}
    labels_right = bool(getattr(config, "is_encoder_decoder", False))
    first = _first_position(config) if model_type in POSITIONS_AFTER_PADDING_IDX else 0
    if not (stated or media or refused or labels_right or first):
        return None
    return BatchLayout(media=media, text_positions=stated.text_positions if stated else True,
                       takes_positions=stated.takes_positions if stated else True,
                       refused_sides=refused, labels_right=labels_right, packing=stated.packing if stated else "",
                       first_position=first)


def _first_position(config: Any) -> int:
    """``padding_idx + 1``: the text config's ``pad_token_id + 1`` (0 where it has none)."""
    pad = getattr(_text_configs(config)[0], "pad_token_id", None)
    return pad + 1 if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 0


def _placed_per_row(processor: Any, config: Any) -> dict[str, MediaKey]:
    """A processor that takes images but writes no placeholder for them, for a model whose config
    names no image token, feeds a model that places each row's image itself (GIT prepends it):
    one per batch row, every row."""
    from .models import sees_images

    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None or any(media_token_ids(processor)) or not sees_images(config):
        return {}
    # the model finds its placeholders by the config's id, which the prompt's template writes
    # (PP-Chart2Table's processor expands none itself)
    if any(isinstance(getattr(config, name, None), int) for name in ("image_token_id", "image_token_index")):
        return {}
    if any(getattr(processor, name, None) is not None for name in ("image_token", "image_token_id")):
        return {}
    keys = getattr(image_processor, "model_input_names", None) or ["pixel_values"]
    return {key: MediaKey(per_row=True) for key in keys if key not in ("input_ids", "attention_mask")}


def _refused_sides(config: Any) -> dict[str, str]:
    """Padding sides the model's own layers get wrong, read from its text config (an encoder-decoder's
    with learned positions and no RoPE: BART's, Florence-2's)."""
    refused: list[str] = []
    for text in _text_configs(config):
        no_rope = getattr(text, "no_rope_layers", None) or ()
        if getattr(text, "attn_temperature_tuning", False) and any(not uses_rope for uses_rope in no_rope):
            floor = getattr(text, "floor_scale", None)
            refused.append(f"its NoPE layers scale attention by a temperature read from each token's slot in the "
                           f"row, which left padding shifts (rows longer than floor_scale={floor} tokens differ)")
        kinds = set(getattr(text, "layer_types", None) or ())
        block = getattr(text, "index_block_size", None)
        if block and kinds - {"full_attention", "sliding_attention"}:
            refused.append(f"its sparse indexer picks key blocks by slot (slot // index_block_size={block}), which "
                           f"left padding shifts")
        if (getattr(text, "is_encoder_decoder", False)
                and isinstance(getattr(text, "max_position_embeddings", None), int)
                and getattr(text, "rope_parameters", None) is None and getattr(text, "rope_theta", None) is None):
            refused.append("its encoder adds a learned position embedding for each token's slot in the row (it takes "
                           "no position ids), which left padding shifts")
    return {"left": "; ".join(dict.fromkeys(refused))} if refused else {}


def _text_configs(config: Any) -> list[Any]:
    """The text config the model reads; every language-model config it holds where transformers
    finds several and cannot tell which (``get_text_config`` raises ValueError): each is checked."""
    from mmrope_core.language_models import text_configs

    if not hasattr(config, "get_text_config"):
        return [config]
    try:
        return [config.get_text_config()]
    except ValueError:
        named = [getattr(config, name) for name in _TEXT_CONFIG_NAMES if getattr(config, name, None) is not None]
        return [*named, *text_configs(config)]


#: the sub-configs ``get_text_config`` chooses among
_TEXT_CONFIG_NAMES = ("text_encoder", "decoder", "generator", "text_config")
