"""The decode peer: a Llama-8B-shaped fp16 decode step written in plain PyTorch (cuBLAS GEMMs,
SDPA over a static KV cache of --context tokens), the whole step captured in one CUDA graph. It is
what a careful torch user gets without an inference engine, measured on the same GPU in the same
run as revolta_bench, so that a ratio survives a noisy machine.

    python benchmarks/torch_decode_peer.py [--batches 1,8,32,64] [--context 1024] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time

# revolta_bench's llama-8b shape
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB = 4096, 14336, 32, 32, 8, 128256
HEAD_DIM = HIDDEN // HEADS


def measure(batches: list[int], context: int, steps: int = 50) -> dict[int, float]:
    import torch
    import torch.nn.functional as F

    dev, dt = "cuda", torch.float16
    gen = torch.Generator(device=dev).manual_seed(0)

    def weight(rows: int, cols: int) -> torch.Tensor:
        return (torch.rand(rows, cols, device=dev, dtype=dt, generator=gen) - 0.5) * (2.0 / cols ** 0.5)

    layers = [dict(qkv=weight((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), o=weight(HIDDEN, HIDDEN),
                   gate_up=weight(2 * INTER, HIDDEN), down=weight(HIDDEN, INTER)) for _ in range(LAYERS)]
    embed, head = weight(VOCAB, HIDDEN), weight(VOCAB, HIDDEN)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, device=dev).float() / HEAD_DIM))

    def rms(x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt)

    def rotate(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x [B, heads, 1, D]
        angles = pos.float()[:, None] * inv_freq[None]
        cos, sin = angles.cos()[:, None, None, :].to(dt), angles.sin()[:, None, None, :].to(dt)
        a, b = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    out = {}
    for B in batches:
        k_cache = [torch.zeros(B, KV_HEADS, context, HEAD_DIM, device=dev, dtype=dt) for _ in range(LAYERS)]
        v_cache = [torch.zeros_like(k) for k in k_cache]
        tokens = torch.zeros(B, dtype=torch.long, device=dev)
        pos = torch.full((B,), context // 2, dtype=torch.long, device=dev)
        # Each sequence attends over the whole cache (a context of `context` tokens).
        visible = torch.ones(B, 1, 1, context, dtype=torch.bool, device=dev)

        def step() -> torch.Tensor:
            x = embed[tokens]
            for w, kc, vc in zip(layers, k_cache, v_cache):
                qkv = rms(x) @ w["qkv"].t()
                q = qkv[:, : HEADS * HEAD_DIM].view(B, HEADS, 1, HEAD_DIM)
                k = qkv[:, HEADS * HEAD_DIM:(HEADS + KV_HEADS) * HEAD_DIM].view(B, KV_HEADS, 1, HEAD_DIM)
                v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].view(B, KV_HEADS, 1, HEAD_DIM)
                q, k = rotate(q, pos), rotate(k, pos)
                kc.index_copy_(2, pos[:1], k)
                vc.index_copy_(2, pos[:1], v)
                a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=visible, enable_gqa=True)
                x = x + a.reshape(B, HIDDEN) @ w["o"].t()
                gu = rms(x) @ w["gate_up"].t()
                x = x + (F.silu(gu[:, :INTER]) * gu[:, INTER:]) @ w["down"].t()
            return (rms(x) @ head.t()).argmax(-1)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            graph.replay()
        torch.cuda.synchronize()
        out[B] = B * steps / (time.perf_counter() - t0)
        del k_cache, v_cache, graph
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--json", help="write {batch: tok/s} here too")
    args = ap.parse_args()
    figures = measure([int(b) for b in args.batches.split(",")], args.context)
    for b, tps in figures.items():
        print(f"torch peer, Llama-8B fp16, {args.context}-token cache, batch {b}: {tps:.1f} tok/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(b): tps for b, tps in figures.items()}, f)


if __name__ == "__main__":
    main()
