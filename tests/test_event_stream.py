"""A streamed response's generator runs its cleanup (the engine abort) when the client goes away,
not when garbage collection reaches it: driven as an ASGI app with a client that disconnects."""

from __future__ import annotations

import asyncio

from revolta.server.streaming import EventStream


def _serve() -> tuple[int, bool]:
    """Streams an endless generator to a client that disconnects while the second chunk is being
    sent; returns the chunks sent and whether the generator's `finally` ran by then."""
    cleaned = []

    async def events():
        try:
            while True:
                yield "data: x\n\n"
                await asyncio.sleep(0)
        finally:
            cleaned.append(True)

    async def main() -> tuple[int, bool]:
        gen = events()  # held here, so only an explicit close can run its finally before the check
        bodies = []
        gone = asyncio.Event()

        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                bodies.append(message["body"])
                if len(bodies) == 2:
                    gone.set()
                    await asyncio.sleep(1.0)  # cancelled by the disconnect while the chunk is in flight

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        scope = {"type": "http", "asgi": {"version": "3.0"}, "method": "POST", "path": "/", "headers": []}
        await asyncio.wait_for(EventStream(gen)(scope, receive, send), timeout=5)
        ran = bool(cleaned)
        await gen.aclose()
        return len(bodies), ran

    return asyncio.run(main())


def test_disconnect_closes_the_generator_at_once():
    sent, cleaned = _serve()
    assert sent == 2
    assert cleaned

