"""GPU benchmark: the engine (revolta_bench, random weights of Llama-1B/8B shapes) against HF
transformers (torch, cuBLAS) on the same GPU in the same run; prints the ratios.

    python benchmarks/bench_gpu.py --bench build/revolta_bench [--shapes llama-1b,llama-8b,qwen3-next-80b]
                                   [--layers 32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

SHAPES = {
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}


# Qwen3-Next-80B-A3B (revolta_bench's qwen3-next-80b); num_hidden_layers comes from --layers.
QWEN3_NEXT_80B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=5120, num_attention_heads=16,
                      num_key_value_heads=2, head_dim=256, partial_rotary_factor=0.25, linear_num_key_heads=16,
                      linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                      linear_conv_kernel_dim=4, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
                      shared_expert_intermediate_size=512, full_attention_interval=4, norm_topk_prob=True)


def hf_model(shape: str, layers: int):
    import torch
    import transformers

    if shape == "qwen3-next-80b":
        cfg = transformers.Qwen3NextConfig(**QWEN3_NEXT_80B, num_hidden_layers=layers, max_position_embeddings=16384)
        cls = transformers.Qwen3NextForCausalLM
    else:
        cfg = transformers.LlamaConfig(**SHAPES[shape], max_position_embeddings=16384, rope_theta=500000.0)
        cls = transformers.LlamaForCausalLM
    torch.set_default_dtype(torch.float16)  # made in fp16 directly: an fp32 copy would not fit
    try:
        with torch.device("cuda"):
            return cls(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)


def hf_figures(shape: str, batches: list[int], prompt: int, decode: int, prefill: int, layers: int = 0) -> dict:
    import torch

    model = hf_model(shape, layers)
    out = {"decode": {}, "prefill": {}}

    def gen(b: int, n: int) -> float:
        ids = torch.randint(1000, 100000, (b, prompt), device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with torch.no_grad():
        gen(1, 2)
        for b in batches:
            t1, tn = gen(b, 1), gen(b, decode)
            out["decode"][b] = b * (decode - 1) / (tn - t1)
        ids = torch.randint(1000, 100000, (1, prefill), device="cuda")
        model(ids)
        torch.cuda.synchronize()
        t = time.perf_counter()
        model(ids)
        torch.cuda.synchronize()
        out["prefill"][prefill] = prefill / (time.perf_counter() - t)
    del model
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of the revolta_bench executable")
    ap.add_argument("--shapes", default="llama-1b,llama-8b")
    ap.add_argument("--hf-batches", default="1,8,32")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32, help="qwen3-next-80b: layers of both models (48 do not fit)")
    args = ap.parse_args()
    batches = [int(b) for b in args.hf_batches.split(",")]
    for shape in args.shapes.split(","):
        cmd = [args.bench, "--shape", shape, "--decode", str(args.decode)]
        if shape == "qwen3-next-80b":
            cmd += ["--layers", str(args.layers), "--prefill", "2048,8192"]
        run = subprocess.run(cmd, check=True, capture_output=True, text=True)
        print(run.stdout, end="")
        ours = json.loads(run.stdout.split("JSON ", 1)[1])
        hf = hf_figures(shape, batches, 128, args.decode, 2048, args.layers)
        print(f"== {shape}: revolta vs HF transformers {__import__('transformers').__version__} (fp16, same GPU, same run)")
        for d in ours["decode"]:
            c = d["concurrency"]
            if c in hf["decode"]:
                print(f"decode c={c:<3} revolta {d['tok_s']:9.1f} tok/s  HF {hf['decode'][c]:9.1f}  "
                      f"ratio {d['tok_s'] / hf['decode'][c]:5.2f}x  ({100 * d['bw_fraction']:.0f}% of read bw)")
        for p in ours["prefill"]:
            if p["tokens"] in hf["prefill"]:
                h = hf["prefill"][p["tokens"]]
                print(f"prefill {p['tokens']:<5} revolta {p['tok_s']:9.0f} tok/s  HF {h:9.0f}  ratio {p['tok_s'] / h:5.2f}x")


if __name__ == "__main__":
    main()
