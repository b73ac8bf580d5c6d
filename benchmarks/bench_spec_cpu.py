"""N-gram speculative decoding on the CPU: the demo model answering prompts that quote their input,
without speculation and with k = 1..4 drafts, in one process; prints tok/s, the ratio to k = 0,
steps and acceptance.

    python benchmarks/bench_spec_cpu.py [--model DIR_OR_GGUF] [--max-tokens 96] [--batch 1]
"""

from __future__ import annotations

import argparse
import time

from revolta import LLM, SamplingParams

TEXT = ("The quick brown fox jumps over the lazy dog. The dog was not amused, and it chased the fox around the farm "
        "until the farmer came out with a broom and told them both to be quiet. Then everyone went to sleep.")
PROMPTS = [
    f"Repeat this text exactly, word for word:\n\n{TEXT}",
    f"Copy the second sentence of this text:\n\n{TEXT}",
    "Fix the spelling in this text and return it:\n\nThe quik brown fox jumpd over the lazzy dog. The dog was not amused.",
    f"Rewrite this text in the past tense, changing nothing else:\n\n{TEXT}",
]


def run(model: str | None, k: int, max_tokens: int, batch: int) -> dict:
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3} if k else None
    with LLM(model, max_model_len=2048, kv_cache_memory_bytes=128 << 20, speculative_config=spec) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        llm.chat([[{"role": "user", "content": "Hi"}]], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
        before = llm.stats()
        tokens, seconds = 0, 0.0
        for i in range(0, len(PROMPTS), batch):
            conv = [[{"role": "user", "content": p}] for p in PROMPTS[i:i + batch]]
            t0 = time.perf_counter()
            outs = llm.chat(conv, params)
            seconds += time.perf_counter() - t0
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        s = llm.stats()
        return {"k": k, "tok_s": tokens / seconds, "tokens": tokens, "steps": s.num_steps - before.num_steps,
                "drafts": s.spec_num_draft_tokens, "accepted": s.spec_num_accepted_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    base = None
    for k in (0, 1, 2, 3, 4):
        r = run(args.model, k, args.max_tokens, args.batch)
        base = base or r["tok_s"]
        rate = f"{r['accepted']}/{r['drafts']} accepted" if r["drafts"] else "no drafts"
        print(f"k={k}: {r['tok_s']:.1f} tok/s ({r['tok_s'] / base:.2f}x), {r['tokens']} tokens in {r['steps']} steps, {rate}")


if __name__ == "__main__":
    main()
