"""Image preprocessing against HF transformers' own Qwen2-VL image processor (its PIL backend, with
Qwen3-VL's patch size 16 and a 0.5 / 0.5 normalisation): the same resized size, patch grid and
pixel rows within 1e-5 for encoded images of several sizes and modes; the budget resizes (977 x
1073 becomes 960 x 1056 at 1,048,576 pixels) and never refuses; bad data is a ValueError saying what
is wrong."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from revolta.multimodal.image import ImageProcessing, decode_image, process_image, smart_resize

CFG = ImageProcessing(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=4096, max_pixels=1048576)


def hf_processor(cfg: ImageProcessing):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=cfg.patch_size, merge_size=cfg.merge_size,
                                    temporal_patch_size=cfg.temporal_patch_size, image_mean=cfg.image_mean,
                                    image_std=cfg.image_std,
                                    size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels})


def encoded(width: int, height: int, mode: str, fmt: str, seed: int) -> bytes:
    """A picture with structure (gradients, edges) and noise, encoded as a file would be."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // max(1, width - 1)), (y * 255 // max(1, height - 1)), ((x // 17 + y // 23) % 2) * 200], -1)
    pixels = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    if mode == "RGBA":
        image.putalpha(Image.fromarray((x * 255 // max(1, width - 1)).astype(np.uint8)))
    elif mode != "RGB":
        image = image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def test_the_budget_resizes():
    assert smart_resize(1073, 977, 32, 4096, 1048576) == (1056, 960)
    assert smart_resize(10, 10, 32, 4096, 1048576) == (64, 64)  # a tiny image grows to min_pixels
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 3000, 32, 4096, 1048576)


@pytest.mark.parametrize("width,height,mode,fmt", [(977, 1073, "RGB", "JPEG"), (640, 480, "RGB", "PNG"), (33, 95, "RGBA", "PNG"),
                                                   (1500, 400, "L", "PNG"), (256, 256, "P", "GIF"), (2200, 1800, "RGB", "WEBP")])
def test_pixels_match_transformers(width, height, mode, fmt):
    data = encoded(width, height, mode, fmt, seed=width)
    ours = process_image(decode_image(data), CFG)
    ref = hf_processor(CFG)(images=[Image.open(io.BytesIO(data))], return_tensors="np")
    assert tuple(int(v) for v in ref["image_grid_thw"][0]) == ours.grid_thw
    assert ours.pixel_values.shape == ref["pixel_values"].shape
    np.testing.assert_allclose(ours.pixel_values, ref["pixel_values"], atol=1e-5)
    t, h, w = ours.grid_thw
    assert ours.num_tokens(CFG.merge_size) == h * w // 4 and t == 1


def test_bad_images_are_named():
    good = encoded(64, 64, "RGB", "PNG", 0)
    with pytest.raises(ValueError, match="not an image"):
        decode_image(b"hello, not a picture")
    with pytest.raises(ValueError, match="could not be decoded"):
        decode_image(good[: len(good) // 2])
    bomb = io.BytesIO()
    Image.new("L", (9000, 9000)).save(bomb, format="PNG")  # small file, 81 M pixels
    with pytest.raises(ValueError, match="pixels"):
        decode_image(bomb.getvalue())
