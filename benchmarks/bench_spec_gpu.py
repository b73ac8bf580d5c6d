"""MTP speculative decoding on the GPU at the Qwen3-Next-80B-A3B shape (dummy weights, its MTP
layer included): tokens/s at concurrency 1 / 4 / 8 with k = 1..4 drafts against k = 0, in one
process. Random weights accept nothing, so acceptance is forced (REVOLTA_FAULT_INJECT=
accept-drafts:R) to what a head accepting each draft position with probability p after the
previous one gives: R = p + p^2 + ... + p^k (p = 0.83: 2.5 accepted per MTP4 step, about the
seed's). The verify step's cost is printed against a plain decode step.

    python benchmarks/bench_spec_gpu.py [--layers 32] [--p 0.83] [--batches 1,4,8] [--ks 0,1,2,3,4]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_gpu import QWEN3_NEXT_80B


def write_config(d: Path, layers: int) -> None:
    cfg = dict(QWEN3_NEXT_80B, num_hidden_layers=layers, max_position_embeddings=16384, mtp_num_hidden_layers=1,
               architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", torch_dtype="bfloat16",
               rms_norm_eps=1e-6, rope_theta=10000000.0, eos_token_id=151645, tie_word_embeddings=False)
    (d / "config.json").write_text(json.dumps(cfg))


def run(model: str, k: int, rate: float, batches: list[int], prompt: int, decode: int) -> list[dict]:
    from revolta import LLM, SamplingParams

    os.environ["REVOLTA_FAULT_INJECT"] = f"accept-drafts:{rate}" if k else ""
    spec = {"method": "mtp", "num_speculative_tokens": k} if k else None
    llm = LLM(model, device="cuda", load_format="dummy", max_model_len=4096, max_num_seqs=max(batches),
              gpu_memory_utilization=0.92, speculative_config=spec)
    rng = np.random.default_rng(0)
    out = []
    try:
        params = SamplingParams(temperature=0.0, max_tokens=decode, ignore_eos=True)
        llm.generate([{"prompt_token_ids": [5] * 16}], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        for b in batches:
            prompts = [{"prompt_token_ids": rng.integers(100, 150000, size=prompt).tolist()} for _ in range(b)]
            before = llm.stats()
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params)
            seconds = time.perf_counter() - t0
            s = llm.stats()
            steps = s.num_steps - before.num_steps
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            drafts = s.spec_num_drafts - before.spec_num_drafts
            accepted = s.spec_num_accepted_tokens - before.spec_num_accepted_tokens
            out.append({"k": k, "batch": b, "tok_s": tokens / seconds, "steps": steps, "ms_per_step": 1e3 * seconds / steps,
                        "mean_accepted": accepted / drafts if drafts else 0.0,
                        "draft_ms": (s.spec_draft_time_us - before.spec_draft_time_us) / 1e3 / max(1, steps),
                        # every step after the prefill verifies drafts
                        "verify_ms": (s.spec_verify_time_us - before.spec_verify_time_us) / 1e3 / max(1, steps - 1)})
    finally:
        llm.shutdown()
        os.environ.pop("REVOLTA_FAULT_INJECT", None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=32, help="of 48 (fp16 weights of all 48 do not fit one H200)")
    ap.add_argument("--p", type=float, default=0.83, help="forced acceptance of each draft position after the previous")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--ks", default="0,1,2,3,4")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=128)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as d:
        write_config(Path(d), args.layers)
        base = {}
        for k in (int(x) for x in args.ks.split(",")):
            rate = sum(args.p ** j for j in range(1, k + 1))
            for r in run(d, k, rate, batches, args.prompt, args.decode):
                if k == 0:
                    base[r["batch"]] = r
                ref = base.get(r["batch"])
                ratio = r["tok_s"] / ref["tok_s"] if ref else float("nan")
                extra = (f", {r['mean_accepted']:.2f} accepted/step (forced {rate:.2f}), draft {r['draft_ms']:.2f} ms/step, "
                         f"verify step {r['verify_ms']:.2f} ms = {r['verify_ms'] / ref['ms_per_step']:.2f}x a decode step"
                         if k and ref else "")
                print(f"k={k} c={r['batch']}: {r['tok_s']:.1f} tok/s ({ratio:.2f}x k=0), {r['ms_per_step']:.2f} ms/step"
                      f"{extra}", flush=True)


if __name__ == "__main__":
    main()
