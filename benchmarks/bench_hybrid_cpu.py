"""CPU speed of a Qwen3-Next-shaped small model (Gated DeltaNet + gated attention + MoE with a
shared expert, random weights) in the engine and in HF transformers, measured in one run.

    python benchmarks/bench_hybrid_cpu.py [--layers 8] [--experts 32]

transformers runs its own PyTorch fallbacks for the delta rule and the causal conv (the optional
CUDA packages are not installed on the CPU), which is what a CPU user of transformers gets.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_cpu import engine_figures, peer_figures, row  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prefill-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()

    import transformers

    import revolta

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(
        vocab_size=32000, hidden_size=512, num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2,
        head_dim=64, intermediate_size=1024, num_experts=args.experts, num_experts_per_tok=4, moe_intermediate_size=128,
        shared_expert_intermediate_size=256, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
        linear_value_head_dim=64, max_position_embeddings=4096,
    )
    hf = transformers.Qwen3NextForCausalLM(cfg).float().eval()
    params = sum(p.numel() for p in hf.parameters())
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d, safe_serialization=True)
        rng = random.Random(0)
        prompts8 = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randrange(16, 48))] for _ in range(8)]
        long_prompt = [rng.randrange(3, cfg.vocab_size) for _ in range(args.prefill_len)]
        print(f"Qwen3-Next-shaped: {args.layers} layers (3 DeltaNet : 1 attention), hidden 512, {args.experts} experts top-4 "
              f"+ shared, {params / 1e6:.0f}M parameters; {args.threads} threads")
        ref = peer_figures(hf, prompts8, long_prompt, args.new_tokens)
        print(row("transformers float32", ref))
        del hf
        llm = revolta.LLM(d, num_threads=args.threads, kv_cache_memory_bytes=256 << 20, max_model_len=2048)
        got = engine_figures(llm, prompts8, long_prompt, args.new_tokens)
        llm.shutdown()
        print(row("revolta float32", got, ref))


if __name__ == "__main__":
    main()
