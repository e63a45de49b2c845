"""The torch kernels that stand in for torchvision's in the image processors of
cases_pad_stand_b.py keep torchvision's contract, and the processors built on them keep their
own: the tokens each image gets are those the processor's own count (which reads no pixels) gives."""

from __future__ import annotations

import random

import pytest
import torch
from cases_pad_stand_b import extra_cases
from torchvision_stand_in import FUNCTIONAL, InterpolationMode


def test_the_kernels_keep_torchvisions_shapes_dtypes_and_fills():
    image = torch.arange(2 * 3 * 4 * 6, dtype=torch.uint8).reshape(2, 3, 4, 6)
    resized = FUNCTIONAL.resize(image, [8, 3], interpolation=InterpolationMode.BICUBIC)
    assert resized.shape == (2, 3, 8, 3) and resized.dtype == torch.uint8
    assert FUNCTIONAL.resize(image.float(), 2).shape == (2, 3, 2, 3)  # the shorter side to 2
    padded = FUNCTIONAL.pad(image, [1, 0, 2, 3], fill=[255, 0, 7])  # left, top, right, bottom
    assert padded.shape == (2, 3, 7, 9)
    assert padded[:, 0, :, 0].eq(255).all() and padded[:, 2, -1].eq(7).all() and padded[:, 1, 4:].eq(0).all()
    assert torch.equal(padded[..., :4, 1:7], image)
    assert torch.equal(FUNCTIONAL.crop(image, 1, 2, 2, 3), image[..., 1:3, 2:5])
    normalized = FUNCTIONAL.normalize(torch.ones(3, 2, 2), [0.5, 0.5, 0.0], [0.5, 0.25, 1.0])
    assert normalized[:, 0, 0].tolist() == [1.0, 2.0, 1.0]
    assert FUNCTIONAL.grayscale_to_rgb(torch.zeros(1, 2, 2)).shape == (3, 2, 2)
    assert FUNCTIONAL.to_dtype(torch.tensor([255], dtype=torch.uint8), torch.float32, scale=True).item() == 1.0


def counted_tokens(processor, image):
    """The tokens of ``image`` by the processor's own count from its size alone."""
    if hasattr(processor, "_get_num_multimodal_tokens"):  # Muse Glimmer, Muse Spark
        return processor._get_num_multimodal_tokens(image_sizes=[(image.height, image.width)])["num_image_tokens"][0]
    # Step-3.7: a global view and each local crop
    crops = processor.image_processor.get_number_of_image_patches(image.height, image.width)
    return processor.num_image_feature_size + crops * processor.num_patch_feature_size


@pytest.mark.parametrize("name", [name for name in extra_cases() if "muse" in name or "step3p7" in name])
def test_an_image_gets_the_tokens_the_processors_own_count_gives(name):
    build, calls, _ = extra_cases()[name]
    processor, _ = build()
    checked = 0
    for call in calls(processor, random.Random(0)):
        images = call.get("images", [])
        if images:
            ids = processor(**call)["input_ids"]
            assert int((ids == processor.image_token_id).sum()) == sum(counted_tokens(processor, image)
                                                                       for image in images)
            checked += len(images)
    assert checked
