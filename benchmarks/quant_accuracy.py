"""Accuracy of the quantized weight paths against the unquantized model, on the demo model.

    python benchmarks/quant_accuracy.py [--prompts 8] [--tokens 24]

Reference: the demo SmolLM2-135M-Instruct imported to float32 (its GGUF's Q4_1 values, exactly).
Each format is run teacher-forced on the reference's own greedy continuations of fixed prompts:
at every continuation position, KL(reference || format) of the next-token distributions and
whether the argmax agrees. Formats: the same GGUF read in place (blocks kept; 16- and 8-bit
activations in decode-sized linear layers), and AWQ copies of the float32 import made by `revolta quantize --awq`
in groups of 32 and 128 (round to nearest, so their error adds to the Q4_1 values'; with groups of
128 only the projections whose input size is a multiple of 128 are quantized: SmolLM2's down
projections, K = 1536, not its K = 576 ones), and an FP8 copy (E4M3, a scale per 128 x 128 block).
Not a test.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.\n",
    "def fibonacci(n):\n    ",
    "Photosynthesis is the process by which",
    "List three uses of copper:\n1.",
    "The quick brown fox",
    "Translate to French: Good morning, how are you?\n",
    "In 1969, the Apollo 11 mission",
    "A healthy breakfast includes",
    "The main difference between a list and a tuple in Python is",
]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def position_logits(llm, contexts: list[list[int]]) -> np.ndarray:
    """The next-token logits after each context. One request at a time, each context extending
    the last, so the prefix cache holds all but the last few tokens (under one block): those are
    computed as decode-sized batches, as in serving (GGUF blocks: the 8-bit-activation path)."""
    from revolta import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=1, return_generation_logits=True)
    return np.stack([np.asarray(llm.generate([{"prompt_token_ids": c}], sp)[0].outputs[0].generation_logits[0])
                     for c in contexts])


def main() -> None:
    from revolta import LLM, SamplingParams
    from revolta.models.resolve import demo_gguf, demo_model
    from revolta.quantize import quantize_awq, quantize_fp8

    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    ref_dir = demo_model("safetensors")
    ref = LLM(ref_dir, kv_cache_memory_bytes=256 << 20, max_model_len=512)
    tok = ref.get_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[: args.prompts]]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    conts = [o.outputs[0].token_ids for o in ref.generate([{"prompt_token_ids": p} for p in prompts], greedy)]
    contexts = [p + c[:i] for p, c in zip(prompts, conts) for i in range(len(c))]
    want = log_softmax(position_logits(ref, contexts))
    ref.shutdown()
    with tempfile.TemporaryDirectory() as tmp:
        formats = {f"GGUF Q4_1 in place, {bits}-bit activations": (str(demo_gguf()), dict(block_activation_bits=bits))
                   for bits in (16, 8)}
        for group in (32, 128):
            formats[f"AWQ int4 g{group} (revolta quantize)"] = (str(quantize_awq(ref_dir, f"{tmp}/g{group}", group)), {})
        formats["FP8 E4M3, 128x128 scales (revolta quantize)"] = (str(quantize_fp8(ref_dir, f"{tmp}/fp8")), {})
        print(f"{len(contexts)} positions ({len(prompts)} prompts x {args.tokens} greedy tokens of the reference)")
        print(f"{'format':42s} {'mean KL':>10s} {'max KL':>10s} {'top-1 agree':>12s}")
        for name, (path, kw) in formats.items():
            llm = LLM(path, kv_cache_memory_bytes=256 << 20, max_model_len=512, **kw)
            got = log_softmax(position_logits(llm, contexts))
            llm.shutdown()
            kl = (np.exp(want) * (want - got)).sum(axis=-1)
            agree = (want.argmax(-1) == got.argmax(-1)).mean()
            print(f"{name:42s} {kl.mean():10.5f} {kl.max():10.5f} {100 * agree:11.1f}%")


if __name__ == "__main__":
    main()
