"""Video preprocessing against HF transformers' Qwen3-VL video processor: its defaults, its frame
sampling, its size rule (one pixel budget over all frames) and its patch rows. HF resizes with
torchvision, whose CPU path for uint8 bicubic frames is torch's antialiased interpolate: the
reference runs that, then HF's own patchify; the engine resizes with Pillow, within one level of
the 255."""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from revolta.multimodal.image import ImageProcessing
from revolta.multimodal.prompt import MultimodalProcessor, VisionTokens
from revolta.multimodal.video import Video, VideoError, VideoProcessing, sample_indices, video_size

# Imported by module path: the package's lazy loader asks for torchvision, which the size rule,
# the sampler and patchify do not use.
HF = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")
HFVideo = HF.Qwen3VLVideoProcessor


def test_defaults_are_qwen3_vl_video_processors():
    cfg = VideoProcessing()
    assert (cfg.min_pixels, cfg.max_pixels) == (HFVideo.size["shortest_edge"], HFVideo.size["longest_edge"])
    assert (cfg.fps, cfg.min_frames, cfg.max_frames) == (HFVideo.fps, HFVideo.min_frames, HFVideo.max_frames)
    assert (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size) == (HFVideo.patch_size, HFVideo.temporal_patch_size,
                                                                         HFVideo.merge_size)
    assert cfg.image_mean == list(HFVideo.image_mean) and cfg.image_std == list(HFVideo.image_std)


@pytest.mark.parametrize("frames,height,width", [(16, 360, 480), (4, 1080, 1920), (2, 24, 40), (768, 720, 1280),
                                                 (7, 977, 1073), (30, 20, 900), (5, 64, 64), (3, 2000, 30)])
def test_size_rule_matches_hf(frames, height, width):
    cfg = VideoProcessing()
    expected = HF.smart_resize(frames, height, width, temporal_factor=2, factor=32, min_pixels=cfg.min_pixels,
                               max_pixels=cfg.max_pixels)
    assert video_size(frames, height, width, cfg) == expected
    h, w = expected
    assert h % 32 == 0 and w % 32 == 0


def test_size_rule_refuses_extreme_aspect_and_pads_one_frame():
    cfg = VideoProcessing()
    with pytest.raises(VideoError, match="aspect ratio"):
        video_size(4, 32, 32 * 201, cfg)
    # HF refuses a single frame; here it counts as the temporal patch it is padded to
    assert video_size(1, 360, 480, cfg) == HF.smart_resize(2, 360, 480, 2, 32, cfg.min_pixels, cfg.max_pixels)


@pytest.mark.parametrize("total,video_fps,fps", [(300, 30.0, 2.0), (12, 10.0, 2.0), (3, 24.0, 2.0), (100000, 25.0, 2.0),
                                                 (900, 29.97, 1.0), (50, 25.0, 4.0)])
def test_frame_sampling_matches_hf(total, video_fps, fps):
    cfg = VideoProcessing()
    # HF's sampler as a plain function: it reads only these three options off its processor
    options = SimpleNamespace(fps=cfg.fps, min_frames=cfg.min_frames, max_frames=cfg.max_frames)
    expected = HFVideo.sample_frames(options, SimpleNamespace(total_num_frames=total, fps=video_fps), fps=fps)
    ours = sample_indices(total, video_fps, fps, cfg.min_frames, cfg.max_frames)
    np.testing.assert_array_equal(ours, expected)


def frames_with_structure(count: int, height: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 255 // (width - 1)), (y * 255 // (height - 1)), ((x // 17 + y // 23) % 2) * 200], -1)
    return np.stack([np.clip(base + rng.normal(0, 18, base.shape) + 4 * t, 0, 255).astype(np.uint8) for t in range(count)])


def hf_rows(frames: np.ndarray, cfg: VideoProcessing):
    """HF's processing of the frames with torchvision's CPU resize (torch's uint8 antialiased bicubic)."""
    h, w = HF.smart_resize(len(frames), frames.shape[1], frames.shape[2], cfg.temporal_patch_size, cfg.factor,
                           cfg.min_pixels, cfg.max_pixels)
    v = torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous()
    resized = torch.nn.functional.interpolate(v, size=[h, w], mode="bicubic", antialias=True, align_corners=False)
    mean = torch.tensor(cfg.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(cfg.image_std).view(1, 3, 1, 1)
    normed = (resized.float() / 255.0 - mean) / std
    rows, gt, gh, gw = HFVideo.patchify(None, normed[None], cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size)
    return rows[0].numpy(), (gt, gh, gw)


@pytest.mark.parametrize("count,height,width", [(16, 360, 480), (5, 240, 200), (4, 40, 64)])
def test_patch_rows_match_hf(count, height, width):
    cfg = VideoProcessing()
    frames = frames_with_structure(count, height, width, seed=count)
    processor = MultimodalProcessor(VisionTokens(1, 2, 3, 4), ImageProcessing(), None, cfg)
    ours, stamps = processor.video(Video(frames, fps=2.0))
    ref, grid = hf_rows(frames, cfg)
    assert ours.grid_thw == grid
    assert ours.pixel_values.shape == ref.shape
    diff = np.abs(ours.pixel_values - ref)
    level = 1.0 / 255.0 / min(cfg.image_std)
    assert diff.max() <= level + 1e-5  # Pillow and torch round an odd pixel the other way
    assert (diff > 1e-5).mean() < 0.02
    assert len(stamps) == grid[0]


def test_checkpoint_video_config_is_read(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"patch_size": 14, "spatial_merge_size": 2,
                                                                          "temporal_patch_size": 2},
                                                      "image_token_id": 1, "video_token_id": 2}))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(
        {"size": {"shortest_edge": 4096, "longest_edge": 25165824}, "fps": 1, "max_frames": 32}))
    cfg = MultimodalProcessor.for_model(tmp_path).video_processing
    assert (cfg.min_pixels, cfg.max_pixels, cfg.fps, cfg.max_frames, cfg.patch_size) == (4096, 25165824, 1, 32, 14)
