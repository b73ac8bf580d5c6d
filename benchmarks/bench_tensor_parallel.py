"""Tensor parallelism: decode tok/s at each tensor_parallel_size and concurrency in one process,
the greedy tokens checked against TP 1, and the ratio to TP 1 (the peer of the same run).

    python benchmarks/bench_tensor_parallel.py [--model DIR] [--tp 1,3] [--concurrency 1,8]
                                               [--prompt 128] [--tokens 64] [--device cpu]
    python benchmarks/bench_tensor_parallel.py --device cuda [--tp 1,2,4] [--layers 32]

On the CPU the ranks are threads sharing --threads cores (default all), so the figure is the cost
or gain of splitting the same cores; the demo model (9 heads, 3 KV heads) splits over 1 and 3.
On GPUs (a rank per GPU, NCCL) it runs revolta_bench on the Qwen3-Next-80B-A3B shape with made-up
weights at each tensor_parallel_size (greedy tokens compared by digest, per-token latency against
TP 1), then revolta_allreduce_bench: all-reduce latency by message size over 1, 2, 4 GPUs.
"""

from __future__ import annotations

import argparse
import os
import time

from revolta import LLM, SamplingParams


def decode(model: str | None, tp: int, conc: int, prompt: int, tokens: int, device: str, threads: int):
    prompts = [{"prompt_token_ids": [1] + [(37 * i + 11 * j) % 20000 + 100 for j in range(prompt - 1)]}
               for i in range(conc)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    with LLM(model, device=device, tensor_parallel_size=tp, num_threads=threads, max_model_len=prompt + tokens + 16,
             kv_cache_memory_bytes=256 << 20) as llm:
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))  # warm-up
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        seconds = time.perf_counter() - t0
        # the prefill's share, timed alone, taken out: what is left is decode
        t1 = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        prefill = time.perf_counter() - t1
    ids = [o.outputs[0].token_ids for o in outs]
    return conc * (tokens - 1) / max(1e-9, seconds - prefill), ids


def gpu_runs(args) -> None:
    import re
    import subprocess
    from pathlib import Path

    import revolta

    bin_dir = Path(revolta.__file__).parent / "bin"
    rows = {}
    for tp in (int(x) for x in args.tp.split(",")):
        cmd = [str(bin_dir / "revolta_bench"), "--shape", "qwen3-next-80b", "--layers", str(args.layers),
               "--concurrency", args.concurrency, "--prefill", ",", "--prompt", str(args.prompt),
               "--decode", str(args.tokens), "--tensor-parallel-size", str(tp)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"tp {tp}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
            continue
        for line in out.stdout.splitlines():  # concurrency, tok/s, ms/step, ..., greedy digest (last)
            m = re.match(r"^(\d+)\s+([\d.]+)\s+([\d.]+)\s.*\s([0-9a-f]{18})$", line)
            if m:
                rows[(tp, int(m[1]))] = (float(m[2]), float(m[3]), m[4])
    print(f"Qwen3-Next-80B-A3B shape, {args.layers} layers, made-up weights")
    print(f"{'tp':>3} {'concurrency':>11} {'decode tok/s':>13} {'ms/token step':>14} {'latency vs tp 1':>16}  tokens")
    for (tp, conc), (tok_s, ms, digest) in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        base = rows.get((1, conc))
        ratio = f"{ms / base[1]:.2f}" if base else "-"
        same = "-" if not base else "equal to tp 1" if digest == base[2] else "DIFFER from tp 1"
        print(f"{tp:>3} {conc:>11} {tok_s:>13.1f} {ms:>14.2f} {ratio:>16}  {same}", flush=True)
    subprocess.run([str(bin_dir / "revolta_allreduce_bench"), "--ranks", args.tp])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model directory (default: the demo model)")
    ap.add_argument("--tp", default="1,3")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--layers", type=int, default=32, help="GPU runs: layers of the Qwen3-Next shape")
    args = ap.parse_args()
    if args.device == "cuda":
        gpu_runs(args)
        return
    tps = [int(x) for x in args.tp.split(",")]
    print(f"{'tp':>3} {'concurrency':>11} {'decode tok/s':>13} {'vs tp 1':>8}  tokens")
    for conc in (int(x) for x in args.concurrency.split(",")):
        base, base_ids = None, None
        for tp in tps:
            tok_s, ids = decode(args.model, tp, conc, args.prompt, args.tokens, args.device, args.threads)
            if base is None:
                base, base_ids = tok_s, ids
            same = "equal to tp 1" if ids == base_ids else "DIFFER from tp 1"
            print(f"{tp:>3} {conc:>11} {tok_s:>13.1f} {tok_s / base:>8.2f}  {same}", flush=True)


if __name__ == "__main__":
    main()
