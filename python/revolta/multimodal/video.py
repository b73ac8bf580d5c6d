"""Video files as the Qwen3-VL video processor takes them: decoded with PyAV (the `av` package from
PyPI, installed with `revolta[video]`), frames taken at `fps` per second of video (between min_frames
and max_frames, evenly spread), each with its time in the video; every frame resized to one size whose
pixel budget covers all the frames together (video_preprocessor_config.json's `size`)."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from revolta.multimodal.image import ImageProcessing

MAX_DECODED_FRAMES = 36000  # a longer video is refused (20 minutes at 30 frames a second)


@dataclass
class VideoProcessing(ImageProcessing):
    """The video processor's options, Qwen3-VL's defaults: the image options with a pixel budget that
    bounds all sampled frames together (HF's `size.shortest_edge` / `size.longest_edge` for video),
    and the frame sampling."""

    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 768 * 32 * 32
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768

    @classmethod
    def from_model(cls, model_dir: str | Path, patch_size: int, temporal_patch_size: int, merge_size: int) -> "VideoProcessing":
        """From the checkpoint's video_preprocessor_config.json; the tower's patch sizes otherwise."""
        out = cls(patch_size=patch_size, temporal_patch_size=temporal_patch_size, merge_size=merge_size)
        out.read(Path(model_dir) / "video_preprocessor_config.json")
        return out


def video_size(frames: int, height: int, width: int, cfg: VideoProcessing) -> tuple[int, int]:
    """The frames' common size: multiples of the factor nearest the aspect ratio, with frames x height x
    width within the budget (a frame smaller than one factor first scaled up to it). A video of fewer
    frames than a temporal patch counts as one patch of them (it is padded so)."""
    factor, tp = cfg.factor, cfg.temporal_patch_size
    frames = max(frames, tp)
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise VideoError(f"the video's aspect ratio {max(height, width) / min(height, width):.0f} is over 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    t = round(frames / tp) * tp
    if t * h * w > cfg.max_pixels:
        beta = math.sqrt(frames * height * width / cfg.max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif t * h * w < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (frames * height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


class VideoError(ValueError):
    """What is wrong with a video (PyAV's own errors are ValueErrors too: they are rewrapped)."""


@dataclass
class Video:
    """Sampled frames (uint8 [T, H, W, 3]) and when each was taken: `times` in seconds, or frame i at
    i / fps when there are none."""

    frames: np.ndarray
    fps: float = 2.0
    times: list[float] = field(default_factory=list)

    def time_of(self, i: int) -> float:
        return self.times[i] if self.times else i / self.fps


def sample_indices(total: int, video_fps: float, fps: float, min_frames: int, max_frames: int) -> np.ndarray:
    """Which of `total` frames to keep: total / video_fps * fps of them (at least min_frames, at most
    max_frames and total), evenly spread from the first to the last."""
    n = int(total / video_fps * fps)
    n = min(max(n, min_frames), max_frames, total)
    return np.linspace(0, total - 1, n).round().astype(int)


def decode_video(data: bytes, fps: float = 2.0, min_frames: int = 4, max_frames: int = 768) -> Video:
    """The sampled frames of an encoded video; ValueError saying what is wrong."""
    try:
        import av
    except ImportError:
        raise VideoError("video input needs PyAV (pip install 'revolta[video]')") from None
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise VideoError("the file holds no video stream")
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or 24.0
            decoded, times = [], []
            for frame in container.decode(stream):
                if len(decoded) >= MAX_DECODED_FRAMES:
                    raise VideoError(f"the video has more than {MAX_DECODED_FRAMES} frames")
                decoded.append(frame)
                times.append(float(frame.time) if frame.time is not None else len(times) / rate)
            if not decoded:
                raise VideoError("the video has no frames")
            keep = sample_indices(len(decoded), rate, fps, min_frames, max_frames)
            frames = np.stack([decoded[i].to_ndarray(format="rgb24") for i in keep])
    except VideoError:
        raise
    except Exception as e:  # noqa: BLE001 - PyAV's errors for corrupt or unsupported data are many
        raise VideoError(f"the video could not be decoded ({e})") from None
    return Video(frames, fps=fps, times=[times[i] for i in keep])
