"""Kernel time per decode step on the GPU: the engine with random weights of a Llama or the
Qwen3-Next-80B-A3B shape under torch.profiler (CUPTI sees the engine's kernels, graph replays
included), sorted by total time.

    python benchmarks/profile_decode.py [--shape llama-8b|qwen3-next-80b] [--layers N] [--prompt 512]
                                        [--tokens 16] [--eager]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench_gpu import QWEN3_NEXT_80B, SHAPES


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-8b", choices=sorted(SHAPES) + ["qwen3-next-80b"])
    ap.add_argument("--layers", type=int, default=0, help="layers (default: the shape's; qwen3-next-80b: 8)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=16, help="decode steps profiled")
    ap.add_argument("--concurrency", type=int, default=1, help="sequences decoded together")
    ap.add_argument("--eager", action="store_true", help="no decode graphs")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    import revolta

    if args.shape == "qwen3-next-80b":
        cfg = dict(QWEN3_NEXT_80B, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next",
                   num_hidden_layers=args.layers or 8, max_position_embeddings=8192, rms_norm_eps=1e-6,
                   rope_theta=10000000.0, decoder_sparse_step=1, mlp_only_layers=[], torch_dtype="bfloat16",
                   bos_token_id=1, eos_token_id=2)
    else:
        cfg = dict(SHAPES[args.shape], architectures=["LlamaForCausalLM"], model_type="llama",
                   max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, torch_dtype="bfloat16",
                   bos_token_id=1, eos_token_id=2)
        if args.layers:
            cfg["num_hidden_layers"] = args.layers
    d = Path(tempfile.mkdtemp())
    (d / "config.json").write_text(json.dumps(cfg))
    llm = revolta.LLM(str(d), device="cuda", load_format="dummy", max_model_len=4096, gpu_memory_utilization=0.5,
                      enforce_eager=args.eager)
    prompt = [{"prompt_token_ids": list(range(100 + i, 100 + i + args.prompt))} for i in range(args.concurrency)]
    sp = revolta.SamplingParams(temperature=0.0, max_tokens=args.tokens + 1, ignore_eos=True)
    llm.generate(prompt, sp)  # warm-up: graphs recorded, pools sized
    t = time.perf_counter()
    llm.generate(prompt, sp)
    print(f"{args.shape}, eager={args.eager}, {args.concurrency} sequences: prefill {args.prompt} + {args.tokens} decode steps in "
          f"{(time.perf_counter() - t) * 1e3:.1f} ms")
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        llm.generate(prompt, sp)
    torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=80))
    llm.shutdown()


if __name__ == "__main__":
    main()
