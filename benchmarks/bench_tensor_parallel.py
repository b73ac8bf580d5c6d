"""Tensor parallelism: decode tok/s at each tensor_parallel_size and concurrency in one process,
the greedy tokens checked against TP 1, and the ratio to TP 1 (the peer of the same run).

    python benchmarks/bench_tensor_parallel.py [--model DIR] [--tp 1,3] [--concurrency 1,8]
                                               [--prompt 128] [--tokens 64] [--device cpu]

On the CPU the ranks are threads sharing --threads cores (default all), so the figure is the cost
or gain of splitting the same cores; the demo model (9 heads, 3 KV heads) splits over 1 and 3.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model directory (default: the demo model)")
    ap.add_argument("--tp", default="1,3")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
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
