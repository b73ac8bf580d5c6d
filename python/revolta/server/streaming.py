"""Server-sent event responses whose generator is closed when the response ends.

When a client disconnects, Starlette cancels the task that sends the stream; a generator suspended
at a `yield` is then left to garbage collection, which may come seconds later or, where a reference
cycle holds it, much later. The endpoints' generators abort their engine requests in `finally`, so
until then a gone client's request kept generating and holding its cache blocks. Closing the
generator here runs that cleanup as soon as the response is over.
"""

from __future__ import annotations

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class EventStream(StreamingResponse):
    def __init__(self, content, **kwargs) -> None:
        super().__init__(content, media_type="text/event-stream", **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
