"""Serving benchmark: many requests with a spread of prompt and output lengths arriving over time
(Poisson, or all at once) against a revolta-server it starts, through the OpenAI completions API,
streamed. Prints throughput and TTFT / TPOT / ITL / end-to-end latency (mean, p50, p99), as vLLM's
benchmark_serving does, and the ratio of the served output throughput to the engine's own offline
throughput on the same requests (revolta.LLM in this process, after the server stopped).

    python benchmarks/bench_serving.py --engine '{"device": "cuda", "max_num_seqs": 64}' \\
        [--shape llama-8b] [--tokenizer DIR] [--num-prompts 200] [--request-rate 8] [--input-len 512] [--output-len 128] \\
        [--range-ratio 0.5] [--max-concurrency 0] [--no-offline-peer] [--json FILE]

--engine: engine options as JSON (the server's option names); without "model", --shape writes a
config of that shape (load_format dummy: random weights) beside the demo model's tokenizer, its
vocabulary cut to the tokenizer's; --shape demo serves the demo model itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHAPES = {
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=True),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=False),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def shaped_model(shape: str, out: Path, tokenizer: str | None) -> tuple[str, int]:
    """A model directory of `shape` with the demo's tokenizer (or the one in `tokenizer`, a
    directory with tokenizer.json); returns (path, vocab size)."""
    if shape == "demo" or tokenizer is None:
        from revolta.models.resolve import resolve_model

        demo = Path(resolve_model(None))
    else:
        demo = Path(tokenizer)
    if shape == "demo":
        return str(demo), json.loads((demo / "config.json").read_text())["vocab_size"]
    vocab = json.loads((demo / "tokenizer.json").read_text())["model"]["vocab"]
    added = json.loads((demo / "tokenizer.json").read_text()).get("added_tokens", [])
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": max(len(vocab), 1 + max(
           [t["id"] for t in added] or [0])), "max_position_embeddings": 16384, "rope_theta": 500000.0,
           "rms_norm_eps": 1e-5, "torch_dtype": "float16", **SHAPES[shape]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    for name in TOKENIZER_FILES:
        if (demo / name).exists():
            shutil.copy(demo / name, out / name)
    return str(out), cfg["vocab_size"]


def requests(n: int, input_len: int, output_len: int, ratio: float, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    ins = rng.integers(max(1, int(input_len * (1 - ratio))), int(input_len * (1 + ratio)) + 1, size=n)
    outs = rng.integers(max(1, int(output_len * (1 - ratio))), int(output_len * (1 + ratio)) + 1, size=n)
    return [(rng.integers(100, vocab - 100, size=int(i)).tolist(), int(o)) for i, o in zip(ins, outs)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(engine: dict, port: int, log_path: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "revolta.server.cli", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    for k, v in engine.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            args.append(flag if v else "--no-" + k.replace("_", "-"))
        else:
            args += [flag, json.dumps(v) if isinstance(v, (dict, list)) else str(v)]
    return subprocess.Popen(args, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)


async def wait_ready(client, base: str, proc: subprocess.Popen, log_path: Path, timeout: float = 900) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            if (await client.get(base + "/health")).status_code == 200:
                return
        except Exception:
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError("the server did not answer /health")


async def one(client, base: str, model: str, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps, tokens = [], 0
    async with client.stream("POST", base + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                stamps.append(time.perf_counter())
    end = time.perf_counter()
    if not stamps:
        return {"error": "no text streamed"}
    return {"ttft": stamps[0] - t0, "e2e": end - t0, "itl": np.diff(stamps).tolist(), "out": tokens,
            "tpot": (end - stamps[0]) / max(1, tokens - 1)}


async def serve_load(base: str, model: str, reqs, rate: float, max_conc: int, seed: int) -> tuple[list[dict], float]:
    import httpx

    rng = np.random.default_rng(seed + 1)
    limit = asyncio.Semaphore(max_conc) if max_conc > 0 else None

    async def run(client, prompt, n):
        if limit is None:
            return await one(client, base, model, prompt, n)
        async with limit:
            return await one(client, base, model, prompt, n)

    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=4096)) as client:
        tasks = []
        t0 = time.perf_counter()
        for prompt, n in reqs:
            tasks.append(asyncio.create_task(run(client, prompt, n)))
            if rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - t0


def offline_tok_s(engine: dict, reqs) -> float:
    import revolta

    llm = revolta.LLM(**engine)
    sp = [revolta.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in reqs]
    ps = [{"prompt_token_ids": p} for p, _ in reqs]
    llm.generate(ps[:2], sp[:2])  # warm-up
    t = time.perf_counter()
    outs = llm.generate(ps, sp)
    secs = time.perf_counter() - t
    llm.engine.shutdown()
    return sum(len(o.outputs[0].token_ids) for o in outs) / secs


def stats(xs: list[float]) -> dict:
    a = np.asarray(xs, dtype=float) * 1e3
    return {"mean_ms": float(a.mean()), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="{}", help="engine options as JSON")
    ap.add_argument("--shape", default="llama-8b", choices=[*SHAPES, "demo"])
    ap.add_argument("--tokenizer", default=None, help="a directory with tokenizer.json for --shape (default: the demo's)")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests per second (Poisson); inf: all at once")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--range-ratio", type=float, default=0.5, help="lengths uniform in len * [1 - r, 1 + r]")
    ap.add_argument("--max-concurrency", type=int, default=0, help="at most this many requests in flight (0: no limit)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-offline-peer", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    engine = json.loads(a.engine)
    tmp = Path(tempfile.mkdtemp(prefix="bench_serving_"))
    if "model" not in engine:
        engine["model"], vocab = shaped_model(a.shape, tmp / a.shape, a.tokenizer)
        if a.shape != "demo":
            engine["load_format"] = "dummy"
    else:
        vocab = json.loads((Path(engine["model"]) / "config.json").read_text())["vocab_size"]
    engine.setdefault("max_model_len", int(a.input_len * (1 + a.range_ratio) + a.output_len * (1 + a.range_ratio)) + 16)
    reqs = requests(a.num_prompts, a.input_len, a.output_len, a.range_ratio, vocab, a.seed)

    port = free_port()
    log_path = tmp / "server.log"
    proc = start_server(engine, port, log_path)
    base = f"http://127.0.0.1:{port}"
    try:
        import httpx

        async def go():
            async with httpx.AsyncClient(timeout=10) as c:
                await wait_ready(c, base, proc, log_path)
                model = (await c.get(base + "/v1/models")).json()["data"][0]["id"]
            await serve_load(base, model, reqs[:4], float("inf"), 0, a.seed)  # warm-up
            return await serve_load(base, model, reqs, a.request_rate, a.max_concurrency, a.seed)

        results, secs = asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    if not ok:
        sys.exit(f"every request failed; first: {errors[0] if errors else '?'}\n{log_path.read_text()[-3000:]}")
    out_tokens = sum(r["out"] for r in ok)
    in_tokens = sum(len(p) for (p, _), r in zip(reqs, results) if "error" not in r)
    fig = {"engine": engine, "shape": a.shape, "num_prompts": a.num_prompts, "request_rate": a.request_rate,
           "input_len": a.input_len, "output_len": a.output_len, "range_ratio": a.range_ratio, "completed": len(ok),
           "failed": len(errors), "duration_s": secs, "request_throughput": len(ok) / secs,
           "input_tok_s": in_tokens / secs, "output_tok_s": out_tokens / secs, "output_tokens": out_tokens,
           "requested_output_tokens": sum(n for (_, n), r in zip(reqs, results) if "error" not in r),
           "ttft": stats([r["ttft"] for r in ok]), "tpot": stats([r["tpot"] for r in ok]),
           "itl": stats([x for r in ok for x in r["itl"]] or [0.0]), "e2e": stats([r["e2e"] for r in ok])}
    print(f"shape {a.shape}, engine {json.dumps({k: v for k, v in engine.items() if k != 'model'})}")
    print(f"{a.num_prompts} requests, rate {a.request_rate}/s, input {a.input_len} / output {a.output_len} tokens "
          f"(x [{1 - a.range_ratio:g}, {1 + a.range_ratio:g}])")
    print(f"completed {len(ok)}, failed {len(errors)}{': ' + errors[0] if errors else ''}, in {secs:.1f} s")
    print(f"throughput: {fig['request_throughput']:.2f} req/s, {fig['input_tok_s']:.0f} input tok/s, "
          f"{fig['output_tok_s']:.0f} output tok/s")
    for k in ("ttft", "tpot", "itl", "e2e"):
        s = fig[k]
        print(f"{k.upper():5s} mean {s['mean_ms']:9.1f} ms  p50 {s['p50_ms']:9.1f} ms  p99 {s['p99_ms']:9.1f} ms")
    if not a.no_offline_peer:
        fig["offline_output_tok_s"] = offline_tok_s(engine, reqs)
        print(f"offline (revolta.LLM, every request at once): {fig['offline_output_tok_s']:.0f} output tok/s; "
              f"served / offline: {fig['output_tok_s'] / fig['offline_output_tok_s']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
