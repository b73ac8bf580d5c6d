"""CPU speed of the engine against HF transformers on the same model, measured in one run.

    python benchmarks/bench_cpu.py [--model DIR_OR_GGUF] [--dtypes float32,bfloat16]

Default model: the demo SmolLM2-135M-Instruct (transformers loads the same GGUF). Prints decode
tok/s at batch 1 and 8 and prefill tok/s for each engine weight dtype, transformers' figures,
and the ratios. Not a test: these machines are noisy; compare figures of one run only.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import torch


def engine_decode(llm, prompts: list[list[int]], new_tokens: int) -> float:
    """Generated tokens per second after every request has its first token."""
    from revolta import _core

    p = _core.SamplingParams()
    p.temperature = 0.0
    p.max_tokens = new_tokens
    p.ignore_eos = True
    ids = {llm.engine.add_request(list(x), p) for x in prompts}
    first: dict[int, float] = {}
    done = 0
    count = 0
    t_end = 0.0
    while done < len(ids):
        for o in llm.engine.await_outputs(1.0):
            if o.request_id not in ids:
                continue
            now = time.perf_counter()
            if o.request_id not in first:
                first[o.request_id] = now
                count += len(o.tokens) - 1
            else:
                count += len(o.tokens)
            if o.finished:
                done += 1
                t_end = now
    return count / (t_end - max(first.values()) + 1e-9) if count else 0.0


def engine_prefill(llm, prompt: list[int], repeats: int = 3) -> float:
    from revolta import SamplingParams

    best = float("inf")
    for r in range(repeats):
        # A fresh first token each time defeats the prefix cache.
        ids = [(prompt[0] + r + 1) % 1000 + 3] + prompt[1:]
        t0 = time.perf_counter()
        llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=1))
        best = min(best, time.perf_counter() - t0)
    return len(prompt) / best


@torch.no_grad()
def hf_decode(model, prompts: list[list[int]], new_tokens: int) -> float:
    batch = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((batch, width), 0, dtype=torch.long)
    mask = torch.zeros((batch, width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
    t1 = time.perf_counter()
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
    t2 = time.perf_counter()
    return batch * (new_tokens - 1) / ((t2 - t1) - (t1 - t0))


@torch.no_grad()
def hf_prefill(model, prompt: list[int], repeats: int = 3) -> float:
    x = torch.tensor([prompt])
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(x, use_cache=False)
        best = min(best, time.perf_counter() - t0)
    return len(prompt) / best


def peer_figures(hf, prompts8, long_prompt, new_tokens: int) -> dict[str, float]:
    return {
        "decode_b1": hf_decode(hf, prompts8[:1], new_tokens),
        "decode_b8": hf_decode(hf, prompts8, new_tokens),
        "prefill": hf_prefill(hf, long_prompt),
    }


def engine_figures(llm, prompts8, long_prompt, new_tokens: int) -> dict[str, float]:
    engine_decode(llm, prompts8[:1], 4)  # warm-up
    return {
        "decode_b1": engine_decode(llm, prompts8[:1], new_tokens),
        "decode_b8": engine_decode(llm, prompts8, new_tokens),
        "prefill": engine_prefill(llm, long_prompt),
    }


def row(label: str, got: dict[str, float], ref: dict[str, float] | None = None) -> str:
    cells = []
    for key, name in (("decode_b1", "decode b1"), ("decode_b8", "decode b8"), ("prefill", "prefill")):
        ratio = f" ({got[key] / ref[key]:.2f}x)" if ref else ""
        cells.append(f"{name} {got[key]:8.1f} tok/s{ratio}")
    return f"{label:<28} " + "   ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="HF directory or GGUF (default: the demo model)")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--gguf-blocks", action="store_true",
                    help="also the GGUF read in place with its quantized blocks kept (load_format gguf), with 16- and "
                    "8-bit activations")
    args = ap.parse_args()

    import revolta
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    if args.model is None or args.model.endswith(".gguf"):
        gguf = Path(args.model) if args.model else revolta.demo_gguf()
        engine_dir = revolta.demo_model("safetensors") if args.model is None else args.model
        hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    else:
        engine_dir = args.model
        hf = AutoModelForCausalLM.from_pretrained(engine_dir, dtype=torch.float32)
    hf.eval()
    vocab = hf.config.vocab_size
    rng = random.Random(0)
    prompts8 = [[rng.randrange(3, vocab) for _ in range(rng.randrange(16, 48))] for _ in range(8)]
    long_prompt = [rng.randrange(3, vocab) for _ in range(args.prefill_len)]

    print(f"model {engine_dir}; {args.threads} threads; {args.new_tokens} new tokens per request")
    ref = peer_figures(hf, prompts8, long_prompt, args.new_tokens)
    print(row("transformers float32", ref))
    del hf
    runs = [("revolta " + dtype, dict(dtype=dtype, load_format="safetensors")) for dtype in args.dtypes.split(",") if dtype]
    if args.gguf_blocks:
        runs += [(f"revolta gguf blocks, {bits}-bit x", dict(load_format="gguf", block_activation_bits=bits)) for bits in (16, 8)]
    for label, opts in runs:
        model = args.model if "blocks" in label else engine_dir
        llm = revolta.LLM(model, num_threads=args.threads, kv_cache_memory_bytes=256 << 20, max_model_len=2048, **opts)
        got = engine_figures(llm, prompts8, long_prompt, args.new_tokens)
        llm.shutdown()
        print(row(label, got, ref))


if __name__ == "__main__":
    main()
