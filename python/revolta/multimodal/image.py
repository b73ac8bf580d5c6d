"""Images as the Qwen2-VL / Qwen3-VL / Qwen3.5 image processor prepares them (HF's PIL backend):
decoded (transparency composited on white), resized with bicubic resampling to multiples of
patch_size x merge_size within a pixel budget (an image over the budget is resized, never refused),
scaled to [0, 1], normalised, and cut into the flat patch rows the vision tower's patch embedding
reads, with the (t, h, w) patch grid."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAX_DECODED_PIXELS = 64 * 1024 * 1024  # a larger image is refused before it is decoded (a decompression bomb)


@dataclass
class ImageProcessing:
    """The processor's options (preprocessor_config.json), Qwen3-VL's defaults."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 64 * 64 * 4
    max_pixels: int = 16384 * 32 * 32
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_model(cls, model_dir: str | Path) -> "ImageProcessing":
        """From the checkpoint's preprocessor_config.json (its `size` or min / max_pixels)."""
        out = cls()
        out.read(Path(model_dir) / "preprocessor_config.json")
        return out

    def read(self, path: Path) -> None:
        """Overrides from a processor config file, where there is one: every option it names, the
        pixel budget as min / max_pixels or `size`'s shortest / longest_edge."""
        if not path.is_file():
            return
        c = json.loads(path.read_text())
        size = c.get("size") or {}
        for name in self.__dataclass_fields__:
            if name not in ("min_pixels", "max_pixels") and c.get(name) is not None:
                setattr(self, name, c[name])
        self.min_pixels = int(c.get("min_pixels") or size.get("shortest_edge") or self.min_pixels)
        self.max_pixels = int(c.get("max_pixels") or size.get("longest_edge") or self.max_pixels)


@dataclass
class ProcessedImage:
    pixel_values: np.ndarray  # float32 [grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size ** 2]
    grid_thw: tuple[int, int, int]

    def num_tokens(self, merge_size: int) -> int:
        """The placeholder tokens the image takes in the prompt (after the patch merger)."""
        t, h, w = self.grid_thw
        return t * h * w // (merge_size * merge_size)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size both of whose sides are multiples of factor, whose area lies within [min_pixels,
    max_pixels], nearest the image's aspect ratio; ValueError past an aspect ratio of 200."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"the image's aspect ratio {max(height, width) / min(height, width):.0f} is over 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def decode_image(data: bytes):
    """A PIL RGB image from encoded bytes; ValueError saying what is wrong (not an image, truncated,
    too many pixels to decode)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as probe:
            w, h = probe.size
            if w * h > MAX_DECODED_PIXELS:
                raise ValueError(f"the image has {w} x {h} pixels; at most {MAX_DECODED_PIXELS} are decoded")
            probe.load()
            return to_rgb(probe)
    except UnidentifiedImageError:
        raise ValueError("the data is not an image in a format this server decodes (PNG, JPEG, WebP, GIF, BMP, ...)") from None
    except (OSError, SyntaxError) as e:  # truncated or corrupt data
        raise ValueError(f"the image could not be decoded ({e})") from None
    except Image.DecompressionBombError as e:
        raise ValueError(f"the image is too large to decode ({e})") from None


def to_rgb(image):
    """RGB, with any transparency composited onto white (as HF's convert_to_rgb)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def process_image(image, cfg: ImageProcessing) -> ProcessedImage:
    """One image (PIL) as the vision tower's patch rows."""
    from PIL import Image

    image = to_rgb(image)
    height, width = smart_resize(image.height, image.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    resized = np.asarray(image.resize((width, height), resample=Image.Resampling.BICUBIC), dtype=np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)
    std = np.asarray(cfg.image_std, dtype=np.float32)
    pixels = ((resized / 255.0 - mean) / std).transpose(2, 0, 1)  # [3, H, W]
    return patchify(pixels[None], cfg)


def patchify(frames: np.ndarray, cfg: ImageProcessing) -> ProcessedImage:
    """frames [T, 3, H, W] (an image is one frame, repeated to fill a temporal patch) as rows of
    temporal_patch_size x patch_size x patch_size patches, each merge_size x merge_size group of
    patches consecutive (the patch merger's order)."""
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if frames.shape[0] % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], tp - frames.shape[0] % tp, axis=0)])
    t, c, height, width = frames.shape
    gt, gh, gw = t // tp, height // p, width // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # gt, gh/m, gw/m, m, m, c, tp, p, p
    rows = np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p), dtype=np.float32)
    return ProcessedImage(rows, (gt, gh, gw))
