"""The engine reading a GGUF in place (load_format gguf) against llama.cpp (llama-cpp-python) on the
same file, the same threads, in one run: decode at batch 1 and prefill (each the best of three),
and whether the greedy text agrees.

    pip install llama-cpp-python     (built from source: several minutes)
    python benchmarks/bench_llama_cpp.py [--threads 2] [--new-tokens 64] [--prefill-len 256]

Files: the demo SmolLM2-135M-Instruct Q4_1 GGUF and copies that llama.cpp's own quantizer makes
from it (`--copies`, default Q8_0; requantized, kept in a temporary directory). Not a test.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_cpu import engine_decode, engine_prefill  # noqa: E402


def requantized(src: Path, out_dir: str, ftype: str) -> Path:
    """A copy of src in another format, made by llama.cpp's own quantizer (Q8_0, Q4_K_S, ...)."""
    import llama_cpp

    out = Path(out_dir) / f"{src.stem}-{ftype}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype} (rc {rc})")
    return out


def llama_cpp_figures(path: Path, threads: int, prompt: list[int], long_prompt: list[int], new_tokens: int):
    """(decode tok/s at batch 1 after the prompt, prefill tok/s, greedy tokens after `prompt`)."""
    from llama_cpp import Llama

    llm = Llama(str(path), n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512, verbose=False)
    best = float("inf")
    for r in range(3):
        llm.reset()
        ids = [(long_prompt[0] + r + 1) % 1000 + 3] + long_prompt[1:]
        t0 = time.perf_counter()
        llm.eval(ids)
        best = min(best, time.perf_counter() - t0)
    prefill = len(long_prompt) / best
    decode = 0.0
    for _ in range(3):  # the best of three, as for the engine
        llm.reset()
        tokens = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0)  # greedy
        out = [next(tokens)]  # the prompt's forward and the first token
        t0 = time.perf_counter()
        while len(out) < new_tokens:
            out.append(next(tokens))
        decode = max(decode, (new_tokens - 1) / (time.perf_counter() - t0))
    del llm  # its threads stop before the next measurement
    return decode, prefill, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=256)
    ap.add_argument("--copies", default="Q8_0", help="formats llama.cpp makes of the Q4_1 file (e.g. Q8_0,Q4_K_S)")
    args = ap.parse_args()

    import revolta
    from revolta import SamplingParams

    src = revolta.demo_gguf()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        files = {"Q4_1": src, **{f: requantized(src, tmp, f) for f in args.copies.split(",") if f}}
        print(f"{args.threads} threads; decode: {args.new_tokens} tokens at batch 1; prefill: {args.prefill_len} tokens")
        for name, path in files.items():
            llm = revolta.LLM(str(path), load_format="gguf", num_threads=args.threads,
                              kv_cache_memory_bytes=256 << 20, max_model_len=2048)
            tok = llm.get_tokenizer()
            prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]),
                                add_special_tokens=False)
            long_prompt = [rng.randrange(3, 40000) for _ in range(args.prefill_len)]
            engine_decode(llm, [prompt], 4)  # warm-up
            ours = (max(engine_decode(llm, [prompt], args.new_tokens) for _ in range(3)), engine_prefill(llm, long_prompt))
            greedy = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
            our_tokens = llm.generate([{"prompt_token_ids": prompt}], greedy)[0].outputs[0].token_ids
            llm.shutdown()
            decode, prefill, their_tokens = llama_cpp_figures(path, args.threads, prompt, long_prompt, args.new_tokens)
            same = next((i for i, (a, b) in enumerate(zip(our_tokens, their_tokens)) if a != b), len(our_tokens))
            print(f"{name}: revolta decode {ours[0]:7.1f} tok/s ({ours[0] / decode:.2f}x), prefill {ours[1]:7.1f} tok/s "
                  f"({ours[1] / prefill:.2f}x); llama.cpp decode {decode:7.1f}, prefill {prefill:7.1f}; greedy tokens "
                  f"equal for the first {same} of {len(our_tokens)}")
            print(f"    revolta:   {tok.decode(our_tokens)!r}\n    llama.cpp: {tok.decode(their_tokens)!r}")


if __name__ == "__main__":
    main()
