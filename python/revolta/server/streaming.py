"""Server-sent event responses whose generator is closed, and whose job is ended, when the
response ends.

When a client disconnects, Starlette cancels the task that sends the stream; a generator suspended
at a `yield` is then left to garbage collection, which may come seconds later or, where a reference
cycle holds it, much later. Closing the generator and ending the job here aborts the engine
requests behind the stream (freeing their cache blocks) as soon as the response is over.
"""

from __future__ import annotations

from typing import Callable

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class EventStream(StreamingResponse):
    def __init__(self, content, on_close: Callable[[], None] | None = None, **kwargs) -> None:
        super().__init__(content, media_type="text/event-stream", **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                close = getattr(self.body_iterator, "aclose", None)
                if close is not None:
                    await close()
            finally:
                if self.on_close is not None:
                    self.on_close()
