"""Vision-tower speed: images per second and the time to the first token of a prompt holding one
1024 x 1024 image, in the engine and in HF transformers' Qwen3_5VisionModel (the peer, in the same
run, on the same device and the same patch rows).

    python benchmarks/bench_vision.py [--device cpu|cuda] [--images 4] [--side 1024] [--depth 27]

The tower has the Qwen3.5-35B-A3B vision_config (27 blocks, hidden 1152, MLP 4304, 16 heads, patch
16, merge 2, out 2048) with random weights (--depth lowers the block count for a quick look). The
decoder behind it is a 2-layer Qwen3.5-MoE text model of width 2048: the first-token time is then
mostly the tower's. Each run sends images the encoder cache has not seen.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

VISION = dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16,
              spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048, num_position_embeddings=2304,
              hidden_act="gelu_pytorch_tanh")
TEXT = dict(vocab_size=4096, hidden_size=2048, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=2,
            head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=512, shared_expert_intermediate_size=512, max_position_embeddings=8192,
            layer_types=["linear_attention", "full_attention"], eos_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [11, 11, 10], "mrope_interleaved": True})
IMAGE, VIDEO, START, END = 4000, 4001, 4002, 4003


def rows_for(side: int, seed: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Normalised patch rows of a random side x side image (the processor's layout)."""
    g = side // 16
    rng = np.random.default_rng(seed)
    return rng.standard_normal((g * g, 3 * 2 * 16 * 16), dtype=np.float32), (1, g, g)


def peer_seconds(cfg, rows: list[np.ndarray], grid, device: str) -> float:
    """HF's tower over the same rows, one image a call (best of 3 after a warm-up)."""
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m

    dtype = torch.float16 if device == "cuda" else torch.float32
    tower = m.Qwen3_5MoeVisionModel._from_config(cfg.vision_config).to(device=device, dtype=dtype).eval()
    g = torch.tensor([grid], device=device)
    best = float("inf")
    with torch.no_grad():
        for rep in range(4):
            t0 = time.perf_counter()
            for r in rows:
                tower(torch.from_numpy(r).to(device=device, dtype=dtype), grid_thw=g)
            if device == "cuda":
                torch.cuda.synchronize()
            if rep:
                best = min(best, time.perf_counter() - t0)
    del tower
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--side", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=27)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import revolta
    from revolta import _core
    from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe as c

    vision = dict(VISION, depth=args.depth)
    cfg = c.Qwen3_5MoeConfig(text_config=TEXT, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
                             vision_start_token_id=START, vision_end_token_id=END)
    with tempfile.TemporaryDirectory() as d:
        raw = cfg.to_dict()
        raw["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
        Path(d, "config.json").write_text(json.dumps(raw))
        opts = dict(load_format="dummy", max_model_len=4096, max_num_batched_tokens=4096, enable_prefix_caching=False,
                    max_num_seqs=8)
        if args.device == "cuda":
            opts.update(device="cuda", gpu_memory_utilization=0.0, kv_cache_memory_bytes=256 << 20)
        else:
            opts.update(dtype="float32", num_threads=args.threads, kv_cache_memory_bytes=64 << 20)
        llm = revolta.LLM(d, **opts)
        sp = revolta.SamplingParams(temperature=0, max_tokens=1)
        seed = iter(range(10**6))

        def prompt():
            r, grid = rows_for(args.side, next(seed))
            n = grid[1] * grid[2] // 4
            ids = [5, START] + [IMAGE] * n + [END, 6]
            media = [_core.MediaInput("image", f"bench-{r[0, 0]}-{r[1, 1]}", 2, *grid, r)]
            return ids, media

        def run(batch) -> float:
            t0 = time.perf_counter()
            ids = llm.engine.add_requests([p for p, _ in batch], [sp.to_core(1)] * len(batch), [], [m for _, m in batch])
            left = set(ids)
            while left:
                for o in llm.engine.await_outputs(0.01):
                    if o.finished:
                        left.discard(o.request_id)
            return time.perf_counter() - t0

        run([prompt()])  # warm-up (kernels, allocator)
        ttft = min(run([prompt()]) for _ in range(3))
        batch_s = min(run([prompt() for _ in range(args.images)]) for _ in range(2))
        llm.shutdown()
    rows = [rows_for(args.side, 10**6 + i)[0] for i in range(args.images)]
    peer = peer_seconds(cfg, rows, rows_for(args.side, 0)[1], args.device)
    print(f"vision tower depth {args.depth}, {args.side} x {args.side} image ({(args.side // 16) ** 2} patches), "
          f"{args.device}, {args.threads} threads")
    print(f"  engine: first token of a one-image prompt {ttft * 1e3:.0f} ms; {args.images} images in {batch_s:.2f} s "
          f"= {args.images / batch_s:.2f} images/s (tower + a 2-layer decoder)")
    print(f"  transformers tower alone: {args.images / peer:.2f} images/s")
    print(f"  ratio (engine images/s / transformers): {(args.images / batch_s) / (args.images / peer):.2f}")


if __name__ == "__main__":
    sys.exit(main())
