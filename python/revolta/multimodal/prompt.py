"""Multimodal prompts for a checkpoint with a vision tower (Qwen3.5, Qwen3-VL): images and videos
processed as the model's HF processor does, each placeholder token of the prompt expanded to the
tokens its media takes, and the engine's MediaInputs (patch rows, grid, offset, content hash).

An image is one `<|image_pad|>` in the prompt (the chat template writes
`<|vision_start|><|image_pad|><|vision_end|>`); it becomes grid_h * grid_w / merge^2 copies. A video
is one `<|vision_start|><|video_pad|><|vision_end|>`, which becomes, per temporal patch of frames,
`<t seconds>` then that frame group's own start / pads / end (Qwen3-VL's timestamps), each group a
MediaInput of its own: the vision tower attends within one frame group, and the decoder's positions
treat each group as its own grid."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from revolta.multimodal.image import ImageProcessing, ProcessedImage, decode_image, patchify, process_image
from revolta.multimodal.video import Video, VideoProcessing, decode_video, video_size


@dataclass
class VisionTokens:
    image: int
    video: int
    start: int
    end: int


def media_hash(rows: np.ndarray, grid: tuple[int, int, int]) -> str:
    """The content key of processed media: its patch rows and grid (so its processing options too)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(rows, dtype=np.float32).tobytes())
    h.update(json.dumps(grid).encode())
    return h.hexdigest()


class MultimodalProcessor:
    def __init__(self, tokens: VisionTokens, processing: ImageProcessing, encode_text: Callable[[str], list[int]] | None,
                 video: VideoProcessing | None = None):
        self.tokens = tokens
        self.processing = processing
        self.encode_text = encode_text
        self.video_processing = video or VideoProcessing(processing.patch_size, processing.temporal_patch_size,
                                                         processing.merge_size)

    @classmethod
    def for_model(cls, model_dir: str | Path, encode_text: Callable[[str], list[int]] | None = None) -> "MultimodalProcessor | None":
        """The processor of a checkpoint whose config.json has a vision_config; None otherwise."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            return None
        cfg = json.loads(path.read_text())
        vision = cfg.get("vision_config")
        if not isinstance(vision, dict):
            return None
        processing = ImageProcessing.from_model(model_dir)
        if not (Path(model_dir) / "preprocessor_config.json").is_file():  # the tower's own sizes
            processing.patch_size = vision.get("patch_size", processing.patch_size)
            processing.temporal_patch_size = vision.get("temporal_patch_size", processing.temporal_patch_size)
            processing.merge_size = vision.get("spatial_merge_size", processing.merge_size)
        tokens = VisionTokens(cfg["image_token_id"], cfg["video_token_id"], cfg.get("vision_start_token_id", -1),
                              cfg.get("vision_end_token_id", -1))
        video = VideoProcessing.from_model(model_dir, processing.patch_size, processing.temporal_patch_size,
                                           processing.merge_size)
        return cls(tokens, processing, encode_text, video)

    # ---- media ----------------------------------------------------------------------------

    def image(self, image: Any) -> ProcessedImage:
        """A PIL image, encoded bytes, or an RGB array (uint8 [H, W, 3]); a processed one as it is."""
        if isinstance(image, ProcessedImage):
            return image
        if isinstance(image, (bytes, bytearray)):
            image = decode_image(bytes(image))
        elif isinstance(image, np.ndarray):
            from PIL import Image

            image = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
        return process_image(image, self.processing)

    def sample_video(self, data: bytes) -> Video:
        """An encoded video file's frames, sampled at the video processor's fps."""
        cfg = self.video_processing
        return decode_video(data, cfg.fps, cfg.min_frames, cfg.max_frames)

    def video(self, video: Video | np.ndarray | bytes) -> tuple[ProcessedImage, list[float]]:
        """Sampled frames (or an encoded video file, sampled here) resized to one size (the first
        frame's decides, within the budget of all frames), normalised and cut into temporal patches;
        with each frame group's timestamp (the mean of its frames' times)."""
        from PIL import Image

        if isinstance(video, (bytes, bytearray)):
            video = self.sample_video(bytes(video))
        elif isinstance(video, np.ndarray):
            video = Video(video)
        frames = np.asarray(video.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
            raise ValueError(f"a video is uint8 frames [T, H, W, 3]; got shape {frames.shape}")
        cfg = self.video_processing
        height, width = video_size(len(frames), frames.shape[1], frames.shape[2], cfg)
        mean = np.asarray(cfg.image_mean, dtype=np.float32)
        std = np.asarray(cfg.image_std, dtype=np.float32)
        out = []
        for f in frames:
            img = Image.fromarray(np.ascontiguousarray(f, dtype=np.uint8)).resize((width, height), Image.Resampling.BICUBIC)
            out.append(((np.asarray(img, dtype=np.float32) / 255.0 - mean) / std).transpose(2, 0, 1))
        processed = patchify(np.stack(out), cfg)
        tp = cfg.temporal_patch_size
        times = [video.time_of(i) for i in range(len(frames))]
        times += [times[-1]] * (-len(times) % tp)
        stamps = [(times[i] + times[i + tp - 1]) / 2 for i in range(0, len(times), tp)]
        return processed, stamps

    # ---- prompts --------------------------------------------------------------------------

    def expand(self, ids: Sequence[int], images: Sequence[Any] = (), videos: Sequence[Any] = ()) -> tuple[list[int], list]:
        """The prompt with each image / video placeholder expanded, and the engine's MediaInputs.
        ValueError when the placeholders and the media do not pair up."""
        from revolta import _core

        t = self.tokens
        m2 = self.processing.merge_size ** 2
        n_img, n_vid = sum(1 for x in ids if x == t.image), sum(1 for x in ids if x == t.video)
        if n_img != len(images):
            raise ValueError(f"the prompt has {n_img} image placeholders for {len(images)} images")
        if n_vid != len(videos):
            raise ValueError(f"the prompt has {n_vid} video placeholders for {len(videos)} videos")
        out: list[int] = []
        media = []
        next_image = next_video = 0
        i = 0
        while i < len(ids):
            tok = ids[i]
            if tok == t.image:
                p = self.image(images[next_image])
                next_image += 1
                media.append(_core.MediaInput("image", media_hash(p.pixel_values, p.grid_thw), len(out), *p.grid_thw,
                                              p.pixel_values))
                out.extend([t.image] * p.num_tokens(self.processing.merge_size))
                i += 1
            elif tok == t.video:
                p, stamps = self.video(videos[next_video])
                next_video += 1
                gt, gh, gw = p.grid_thw
                # the template's start / end around the pad are rewritten per frame group
                wrapped = out[-1:] == [t.start] and i + 1 < len(ids) and ids[i + 1] == t.end
                if wrapped:
                    out.pop()
                rows = gh * gw
                key = media_hash(p.pixel_values, p.grid_thw)
                for k in range(gt):
                    out.extend(self._timestamp(stamps[k]))
                    out.append(t.start)
                    media.append(_core.MediaInput("video", f"{key}#{k}", len(out), 1, gh, gw,
                                                  p.pixel_values[k * rows:(k + 1) * rows]))
                    out.extend([t.video] * (rows // m2))
                    out.append(t.end)
                i += 2 if wrapped else 1
            else:
                out.append(tok)
                i += 1
        return out, media

    def _timestamp(self, seconds: float) -> list[int]:
        if self.encode_text is None:
            raise ValueError("a video prompt needs the model's tokenizer (its frame timestamps are text)")
        return self.encode_text(f"<{seconds:.1f} seconds>")
