"""Kernel time per decode step on the GPU: the engine with random weights of a Llama or the
Qwen3-Next-80B-A3B shape under torch.profiler (CUPTI sees the engine's kernels, graph replays
included), sorted by total time.

    python benchmarks/profile_decode.py [--shape llama-8b|qwen3-next-80b] [--layers N] [--prompt 512]
                                        [--tokens 16] [--eager] [--async-scheduling auto|on|off]
                                        [--speculative K]  (qwen3-next-80b: MTP, K drafts a step, all kept)
"""

from __future__ import annotations

import argparse
import json
import re
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
    ap.add_argument("--async-scheduling", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--speculative", type=int, default=0,
                    help="qwen3-next-80b: verify steps of K MTP drafts (forced accepted, REVOLTA_FAULT_INJECT)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--accept", type=float, default=-1.0, help="with --speculative: drafts kept a step (default: K)")
    ap.add_argument("--timeline", action="store_true",
                    help="also print one decode step kernel by kernel: start, duration and how far each moved "
                         "the step's end (with dependent launch kernels overlap, so durations alone mislead)")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    import revolta

    if args.shape == "qwen3-next-80b":
        cfg = dict(QWEN3_NEXT_80B, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next",
                   num_hidden_layers=args.layers or 8, max_position_embeddings=8192, rms_norm_eps=1e-6,
                   rope_theta=10000000.0, decoder_sparse_step=1, mlp_only_layers=[], torch_dtype="bfloat16",
                   bos_token_id=1, eos_token_id=2, mtp_num_hidden_layers=1)
    else:
        cfg = dict(SHAPES[args.shape], architectures=["LlamaForCausalLM"], model_type="llama",
                   max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, torch_dtype="bfloat16",
                   bos_token_id=1, eos_token_id=2)
        if args.layers:
            cfg["num_hidden_layers"] = args.layers
    d = Path(tempfile.mkdtemp())
    (d / "config.json").write_text(json.dumps(cfg))
    spec = None
    if args.speculative:
        import os

        os.environ["REVOLTA_FAULT_INJECT"] = f"accept-drafts:{args.accept if args.accept >= 0 else args.speculative}"
        spec = {"method": "mtp", "num_speculative_tokens": args.speculative}
    llm = revolta.LLM(str(d), device="cuda", load_format="dummy", max_model_len=4096,
                      gpu_memory_utilization=args.gpu_memory_utilization,
                      enforce_eager=args.eager, async_scheduling=args.async_scheduling, speculative_config=spec)
    prompt = [{"prompt_token_ids": list(range(100 + i, 100 + i + args.prompt))} for i in range(args.concurrency)]
    sp = revolta.SamplingParams(temperature=0.0, max_tokens=args.tokens + 1, ignore_eos=True)
    llm.generate(prompt, sp)  # warm-up: graphs recorded, pools sized
    t = time.perf_counter()
    llm.generate(prompt, sp)
    print(f"{args.shape}, eager={args.eager}, async scheduling {args.async_scheduling}, {args.concurrency} sequences: prefill {args.prompt} + {args.tokens} decode steps in "
          f"{(time.perf_counter() - t) * 1e3:.1f} ms")
    before = llm.stats().num_steps
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        llm.generate(prompt, sp)
    print(f"profiled: {llm.stats().num_steps - before} steps")
    torch.cuda.synchronize()
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=80))
    if args.timeline:
        print_timeline(p)
    llm.shutdown()


def print_timeline(p) -> None:
    """The second-to-last decode step (the kernels after one greedy argmax up to the next), each
    kernel with its start and end relative to the step's first kernel and its marginal time (its end
    minus the latest end before it): the step's critical path, kernel by kernel."""
    from torch.autograd import DeviceType

    kernels = sorted(((e.time_range.start, e.time_range.end, e.name) for e in p.events()
                      if e.device_type == DeviceType.CUDA and "memcpy" not in e.name.lower()
                      and "memset" not in e.name.lower()), key=lambda k: k[0])
    ends = [i for i, k in enumerate(kernels) if "argmax_merge" in k[2]]  # the last kernel of a greedy step
    if len(ends) < 3:
        print("timeline: fewer than three greedy steps found")
        return
    first, last = ends[-3] + 1, ends[-2]
    t0, latest = kernels[first][0], kernels[first][0]
    print(f"timeline of one decode step ({last - first + 1} kernels, {kernels[last][1] - t0:.1f} us):")
    # Device idle time between steps: what the host spends reading tokens and queueing the next step,
    # where async scheduling does not hide it.
    gaps = [kernels[i + 1][0] - kernels[i][1] for i in ends[:-1] if i + 1 < len(kernels)]
    gaps = sorted(gaps[len(gaps) // 2:])  # the later steps: decode ones
    if gaps:
        print(f"device idle between steps: median {gaps[len(gaps) // 2]:.1f} us, max {gaps[-1]:.1f} us "
              f"({len(gaps)} steps)")
    print(f"{'start':>8} {'dur':>7} {'end':>8} {'marginal':>8}  kernel")
    for s, e, name in kernels[first:last + 1]:
        name = re.sub(r"^void |\(anonymous namespace\)::|revolta::cuda::", "", name)
        short = re.sub(r"\(.*", "", name)[:70]
        print(f"{s - t0:8.1f} {e - s:7.1f} {e - t0:8.1f} {max(0.0, e - latest):8.1f}  {short}")
        latest = max(latest, e)


if __name__ == "__main__":
    main()
