"""Time to first token for a long shared document asked about again, by where its KV blocks are:
cold (computed), device hit, host-memory tier hit, disk tier hit, and disk hit after a restart of
the engine, all in one run; then the KV pool in tokens per GiB on the Qwen3-Next-80B-A3B shape for
each cache format.

    python benchmarks/bench_kv_offload.py [--model DIR | --shape llama-8b --layers 8] [--device cpu|cuda]
                                          [--doc-tokens 3000]

Default: the demo model (SmolLM2-135M-Instruct) on the CPU with a 3000-token document. On a GPU:
--device cuda --doc-tokens 32000 with a model directory, or --shape for random float16 weights of a
bench_gpu.py shape (made with transformers into a temporary directory). Each phase uses an engine whose
pool and tiers put the document where the phase wants it (a second document of the same length
evicts the first from the smaller tiers). Not a test: compare figures of one run only.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

from revolta import LLM, SamplingParams

FIRST = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def ttft(llm: LLM, doc: list[int], question: list[int]) -> tuple[float, int, int, int]:
    """Seconds, cached tokens, and blocks brought back from host memory and from disk."""
    before = llm.engine.stats()
    t = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": doc + question}], FIRST)[0]
    secs = time.perf_counter() - t
    s = llm.engine.stats()
    return (secs, out.num_cached_tokens, s.kv_offload_host_hits - before.kv_offload_host_hits,
            s.kv_offload_disk_hits - before.kv_offload_disk_hits)


def pool_table() -> None:
    """KvCacheSpec::bytes_per_token on Qwen3-Next-80B-A3B: 12 attention layers (of 48), 2 KV heads of
    256; tensor parallelism over 4 ranks replicates the 2 KV heads, so a rank holds one."""
    print("\nKV pool per GiB of a rank's memory, Qwen3-Next-80B-A3B (12 attention layers, 2 KV heads of 256)")
    print(f"{'format':<10} {'bytes/token TP1':>16} {'tokens/GiB TP1':>15} {'tokens/GiB TP4':>15}")
    for name, elem, row_extra in (("float16", 2, 0), ("fp8", 1, 0), ("int8", 1, 4)):
        def per_token(heads: int) -> int:
            return 2 * 12 * heads * (256 * elem + row_extra)
        print(f"{name:<10} {per_token(2):>16} {(1 << 30) // per_token(2):>15} {(1 << 30) // per_token(1):>15}")


def random_model(shape: str, layers: int, doc_tokens: int, out: str) -> str:
    import torch
    import transformers

    from bench_gpu import SHAPES

    cfg = transformers.LlamaConfig(**dict(SHAPES[shape], num_hidden_layers=layers),
                                   max_position_embeddings=doc_tokens + 1024, rope_theta=500000.0)
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--shape", default=None, help="random weights of this bench_gpu.py shape instead of --model")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--doc-tokens", type=int, default=3000)
    args = ap.parse_args()
    if args.shape:
        made = tempfile.TemporaryDirectory()
        args.model = random_model(args.shape, args.layers, args.doc_tokens, made.name)
    rng = random.Random(0)
    doc = [rng.randrange(1000, 20000) for _ in range(args.doc_tokens)]
    other = [rng.randrange(1000, 20000) for _ in range(args.doc_tokens)]
    question = [rng.randrange(1000, 20000) for _ in range(24)]
    max_len = args.doc_tokens + 64
    common = dict(device=args.device, max_model_len=max_len, max_num_batched_tokens=8192 if args.device == "cuda" else 2048)
    if args.device == "cuda":
        common["gpu_memory_utilization"] = 0.0
    probe = LLM(args.model, **common)
    per_token = probe.model_info.kv_cache_bytes // probe.model_info.kv_cache_tokens
    probe.engine.shutdown()
    doc_gib = per_token * args.doc_tokens / 2**30
    # A device pool of 1.5 documents: the other document evicts most of this one's blocks.
    pool = dict(common, kv_cache_memory_bytes=int(per_token * args.doc_tokens * 1.5))
    rows = []
    with tempfile.TemporaryDirectory() as root:
        disk = {"root_dir": root, "max_size_bytes": 1 << 40, "min_free_bytes": 0}
        llm = LLM(args.model, **pool, kv_offloading_size=doc_gib * 2.5)  # host: both documents
        rows.append(("cold", *ttft(llm, doc, question)))
        rows.append(("device hit", *ttft(llm, doc, question)))
        ttft(llm, other, question)
        rows.append(("host hit", *ttft(llm, doc, question)))
        llm.engine.shutdown()
        llm = LLM(args.model, **pool, kv_offloading_size=doc_gib * 1.2, kv_offloading_disk=disk)  # host: one
        ttft(llm, doc, question)
        ttft(llm, other, question)  # this document leaves the device and then the host tier; on disk
        rows.append(("disk hit", *ttft(llm, doc, question)))
        llm.engine.shutdown()
        llm = LLM(args.model, **pool, kv_offloading_size=doc_gib * 1.2, kv_offloading_disk=disk)
        rows.append(("after restart", *ttft(llm, doc, question)))
        s = llm.engine.stats()
        llm.engine.shutdown()
    model = f"{args.shape} shape, {args.layers} layers" if args.shape else probe.model_info.architecture
    print(f"{args.doc_tokens}-token document + 24-token question, {model} on {args.device}, "
          f"KV {per_token} bytes/token ({probe.model_info.kv_cache_dtype})")
    print(f"{'phase':<14} {'TTFT s':>8} {'cached tokens':>14} {'host blocks':>12} {'disk blocks':>12} {'vs cold':>8}")
    for name, secs, cached, host, disk_blocks in rows:
        print(f"{name:<14} {secs:>8.3f} {cached:>14} {host:>12} {disk_blocks:>12} {rows[0][1] / secs:>7.1f}x")
    print(f"after restart: {s.kv_offload_disk_hits} blocks from disk, {s.kv_offload_disk_bytes_read / 2**20:.0f} MiB read")
    pool_table()


if __name__ == "__main__":
    main()
