"""A bounded soak of revolta-server: a mixed load of the five text endpoints, with clients that
disconnect and bodies that are bad, for a fixed number of requests (or a fixed time); then checks
that nothing was lost or left hanging, that the engine holds no KV blocks, and that the server's
resident memory is back within 10% of what it was after warm-up.

    python benchmarks/soak.py --requests 2000 --concurrency 8 [--minutes 30] [--model DIR] [--json out.json]

It starts its own server on 127.0.0.1 (a free port) and stops it at the end. Exit status 0 when
every check holds. tests/test_soak.py runs a small version of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

MSG = [{"role": "user", "content": "Name a color and say why you like it."}]

# Bodies that must get a 4xx (and nothing else lost): each names what is wrong with it.
BAD = [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "\ud800"}]}),
    ("/v1/chat/completions", {"model": "m", "messages": MSG, "top_k": 10**12}),
    ("/v1/chat/completions", {"model": "m", "messages": MSG, "max_tokens": "10"}),
    ("/v1/chat/completions", {"model": "m", "messages": []}),
    ("/v1/completions", {"model": "m", "prompt": [-1]}),
    ("/v1/completions", {"model": "m", "prompt": "hi", "stop_token_ids": [2**40]}),
    ("/v1/responses", {"model": "m", "input": [{"role": "robot", "content": "hi"}]}),
    ("/v1/responses", {"model": "m", "input": [{"type": "function_call", "name": "f"}]}),
    ("/v1/messages", {"model": "m", "max_tokens": 4, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]}),
    ("/v1/messages", {"model": "m", "max_tokens": 0, "messages": MSG}),
    ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "\udfff"}]}),
    ("/v1/chat/completions", {"model": "unknown-model", "messages": MSG}),
]


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)  # unexpected statuses or errors
    hanging: list[str] = field(default_factory=list)  # no end within the per-request limit
    latencies: list[float] = field(default_factory=list)


def ops(model: str, max_tokens: int):
    """(name, path, body, streaming, disconnect_after): the mix of a soak."""
    chat = {"model": model, "messages": MSG, "max_tokens": max_tokens}
    return [
        ("chat", "/v1/chat/completions", chat, False, None),
        ("chat-stream", "/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}}, True, None),
        ("chat-n2", "/v1/chat/completions", {**chat, "n": 2, "temperature": 0.8, "seed": 7}, False, None),
        ("completions", "/v1/completions", {"model": model, "prompt": "The ocean is", "max_tokens": max_tokens}, False, None),
        ("completions-stream", "/v1/completions", {"model": model, "prompt": ["Red is", "Blue is"], "max_tokens": max_tokens, "stream": True}, True, None),
        ("responses", "/v1/responses", {"model": model, "input": "Say hello.", "max_output_tokens": max_tokens}, False, None),
        ("responses-stream", "/v1/responses", {"model": model, "input": "Say hello.", "max_output_tokens": max_tokens, "stream": True}, True, None),
        ("messages", "/v1/messages", {"model": model, "messages": MSG, "max_tokens": max_tokens}, False, None),
        ("messages-stream", "/v1/messages", {"model": model, "messages": MSG, "max_tokens": max_tokens, "stream": True}, True, None),
        ("count-tokens", "/v1/messages/count_tokens", {"model": model, "messages": MSG}, False, None),
        ("gone-stream", "/v1/chat/completions", {**chat, "max_tokens": 4 * max_tokens, "ignore_eos": True, "stream": True}, True, 3),
        ("gone-plain", "/v1/completions", {"model": model, "prompt": "Long story:", "max_tokens": 4 * max_tokens, "ignore_eos": True}, False, 0.3),
    ]


async def one(client: httpx.AsyncClient, url: str, op, tally: Tally, limit_s: float) -> None:
    name, path, body, streaming, gone_after = op
    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(_send(client, url + path, body, streaming, gone_after, name, tally), limit_s)
        tally.latencies.append(time.perf_counter() - t0)
    except asyncio.TimeoutError:
        tally.hanging.append(f"{name}: no end within {limit_s} s")
    except Exception as e:  # noqa: BLE001 - every surprise is a lost request
        tally.lost.append(f"{name}: {type(e).__name__}: {e}")


async def _send(client, url, body, streaming, gone_after, name, tally: Tally) -> None:
    if not streaming and gone_after is not None:
        try:
            await client.post(url, json=body, timeout=gone_after)
            tally.outcomes[name + ":finished-first"] += 1
        except httpx.TimeoutException:
            tally.outcomes[name + ":disconnected"] += 1
        return
    if not streaming:
        r = await client.post(url, json=body)
        ok = r.status_code == 200 or (r.status_code == 429 and r.headers.get("retry-after"))
        tally.outcomes[f"{name}:{r.status_code}"] += 1
        if not ok:
            tally.lost.append(f"{name}: HTTP {r.status_code}: {r.text[:200]}")
        return
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            tally.outcomes[f"{name}:{r.status_code}"] += 1
            if r.status_code != 429:
                tally.lost.append(f"{name}: HTTP {r.status_code}: {r.text[:200]}")
            return
        events, errors, last = 0, 0, ""
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                events += 1
                last = line
                errors += line.startswith('data: {"error"') or line.startswith('data: {"type": "error"')
            if gone_after is not None and events >= gone_after:
                tally.outcomes[name + ":disconnected"] += 1
                return  # leaving the block closes the connection
        ended = stream_ended(last, errors)
        tally.outcomes[f"{name}:{'200' if ended else 'cut'}"] += 1
        if not ended:
            tally.lost.append(f"{name}: stream ended with {last[:200]!r} ({errors} error events)")


def stream_ended(last: str, errors: int) -> bool:
    """The stream's last event is its API's normal end, and no error event came before it."""
    if errors or not last.startswith("data: "):
        return False
    if last == "data: [DONE]":
        return True
    kind = json.loads(last[6:]).get("type")
    return kind in ("message_stop", "response.completed", "response.incomplete")


async def bad(client, url, path, body, tally: Tally) -> None:
    r = await client.post(url + path, content=json.dumps(body), headers={"content-type": "application/json"})
    tally.outcomes[f"bad:{r.status_code}"] += 1
    if not 400 <= r.status_code < 500:
        tally.lost.append(f"bad {path}: HTTP {r.status_code}: {r.text[:200]}")


async def load(url: str, model: str, requests: int, concurrency: int, minutes: float | None, max_tokens: int,
               limit_s: float, seed: int, on_warm=None) -> Tally:
    rng = random.Random(seed)
    mix = ops(model, max_tokens)
    tally = Tally()
    issued = 0
    end = time.time() + minutes * 60 if minutes else None
    warm_at = max(1, requests // 10) if not minutes else None
    warm_time = time.time() + min(60.0, minutes * 6) if minutes else None
    warmed = asyncio.Event()

    def next_index() -> int | None:
        nonlocal issued
        if (end is not None and time.time() >= end) or (end is None and issued >= requests):
            return None
        issued += 1
        return issued

    async def worker(client):
        while (i := next_index()) is not None:
            if rng.random() < 0.15:
                path, body = rng.choice(BAD)
                await bad(client, url, path, {**body, "model": model} if body.get("model") == "m" else body, tally)
            else:
                await one(client, url, rng.choice(mix), tally, limit_s)
            if not warmed.is_set() and ((warm_at and i >= warm_at) or (warm_time and time.time() >= warm_time)):
                warmed.set()
                if on_warm:
                    on_warm()

    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(limit_s), limits=limits) as client:
        await asyncio.gather(*[worker(client) for _ in range(concurrency)])
    tally.outcomes["requests"] = issued
    return tally


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "revolta.server.cli", "--port", str(port), "--served-model-name", "soak",
           "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs),
           "--max-waiting-requests", str(args.max_waiting_requests), "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    else:
        cmd += ["--profile", "cpu-demo"]
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("server did not become healthy")
            time.sleep(0.2)
        rss = {"start": rss_bytes(proc.pid)}
        t0 = time.time()
        tally = asyncio.run(load(url, "soak", args.requests, args.concurrency, args.minutes, args.max_tokens,
                                 args.request_limit_s, args.seed, on_warm=lambda: rss.__setitem__("warm", rss_bytes(proc.pid))))
        elapsed = time.time() - t0
        idle_deadline = time.time() + 60
        while True:  # aborts reach the engine a moment after their clients go
            m = metrics(url)
            if m["revolta:num_requests_running"] == 0 and m["revolta:num_requests_waiting"] == 0 and m["revolta:kv_cache_usage_perc"] == 0:
                break
            if time.time() > idle_deadline:
                break
            time.sleep(0.2)
        rss["end"] = rss_bytes(proc.pid)
        healthy = httpx.get(url + "/health", timeout=5).status_code == 200
    finally:
        proc.terminate()
        code = proc.wait(60)
    warm = rss.get("warm", rss["start"])
    report = {
        "requests": tally.outcomes["requests"], "concurrency": args.concurrency, "seconds": round(elapsed, 1),
        "outcomes": dict(sorted((k, v) for k, v in tally.outcomes.items() if k != "requests")),
        "lost": len(tally.lost), "hanging": len(tally.hanging), "examples": (tally.lost + tally.hanging)[:10],
        "kv_cache_usage_after": m["revolta:kv_cache_usage_perc"], "running_after": m["revolta:num_requests_running"],
        "waiting_after": m["revolta:num_requests_waiting"],
        "rss_mb": {k: round(v / 2**20, 1) for k, v in rss.items()}, "rss_growth_after_warmup": round(rss["end"] / warm - 1, 4),
        "p50_s": round(sorted(tally.latencies)[len(tally.latencies) // 2], 3) if tally.latencies else None,
        "healthy_after": healthy, "server_exit_code": code,
    }
    report["ok"] = (report["lost"] == 0 and report["hanging"] == 0 and report["kv_cache_usage_after"] == 0
                    and report["running_after"] == 0 and report["waiting_after"] == 0 and report["rss_growth_after_warmup"] <= 0.10
                    and healthy and code == 0)
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model directory or GGUF; default: the cpu-demo profile's model")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--minutes", type=float, default=None, help="run for this long instead of a number of requests")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-waiting-requests", type=int, default=8)
    ap.add_argument("--request-limit-s", type=float, default=120.0, help="a request with no end by then counts as hanging")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-log", default=None)
    ap.add_argument("--json", default=None, help="also write the report here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
