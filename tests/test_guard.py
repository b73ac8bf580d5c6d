"""The request guard in process: the key is compared in constant time, and bodies are limited
as they arrive, whatever their framing."""

from __future__ import annotations

import asyncio
import hmac

from revolta.config import ServerOptions
from revolta.server.guard import RequestGuard


async def call(guard, headers, chunks):
    """Runs one POST through the guard; returns (status, body the app saw or None)."""
    seen = {}

    async def app(scope, receive, send):
        seen["body"] = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    g = RequestGuard(app, guard)
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(m):
        sent.append(m)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
    await g(scope, receive, send)
    return sent[0]["status"], seen.get("body")


def test_key_is_compared_with_compare_digest(monkeypatch):
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    opts = ServerOptions(api_key="s3cret")
    assert asyncio.run(call(opts, [(b"authorization", b"Bearer s3cret")], [b"{}"]))[0] == 200
    assert asyncio.run(call(opts, [(b"x-api-key", b"s3creT")], [b"{}"]))[0] == 401
    assert asyncio.run(call(opts, [], [b"{}"]))[0] == 401
    assert calls == [(b"s3cret", b"s3cret"), (b"s3creT", b"s3cret")]


def test_body_is_limited_as_it_arrives():
    opts = ServerOptions(max_request_bytes=1000)
    assert asyncio.run(call(opts, [], [b"x" * 600, b"y" * 300])) == (200, b"x" * 600 + b"y" * 300)
    assert asyncio.run(call(opts, [], [b"x" * 600, b"y" * 600]))[0] == 413  # chunked: no Content-Length
    assert asyncio.run(call(opts, [(b"content-length", b"5000")], [b"x"]))[0] == 413


def test_bodies_held_at_once_are_bounded():
    """Sixteen bodies of the maximum size may be held together; one byte more is a 503, and the
    budget is whole again once those requests end."""
    opts = ServerOptions(max_request_bytes=1000)

    async def scenario():
        release = asyncio.Event()

        async def slow_app(scope, receive, send):
            await receive()
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        g = RequestGuard(slow_app, opts)

        async def post(size):
            msgs = [{"type": "http.request", "body": b"x" * size, "more_body": False}]
            sent = []

            async def receive():
                return msgs.pop(0) if msgs else {"type": "http.disconnect"}

            async def send(m):
                sent.append(m)

            await g({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive, send)
            return sent[0]["status"]

        held = [asyncio.ensure_future(post(1000)) for _ in range(16)]
        await asyncio.sleep(0.05)
        refused = await post(1)
        release.set()
        codes = await asyncio.gather(*held)
        return refused, codes, g.held, await post(1000)

    refused, codes, held_after, later = asyncio.run(scenario())
    assert refused == 503 and codes == [200] * 16 and held_after == 0 and later == 200
