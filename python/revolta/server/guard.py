"""The ASGI guard every request passes before a route sees it: the API key, and a request body
limited in size and in time as it arrives, whatever its framing (Content-Length or chunked).

The body is read here in full and handed on to the route; after it, the route's receive() yields
the client's disconnect, which the generating endpoints watch. All bodies held at once are
bounded too (16 x max_request_bytes): beyond that a request gets 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from revolta.config import ServerOptions
from revolta.server.errors import json_error

# The playground's page and files are open: its requests to /v1 carry the key typed into it.
OPEN_PATHS = frozenset({"/", "/health", "/version", "/metrics"})


class _TooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


class _Busy(Exception):
    pass


_BODY_BUDGET_REQUESTS = 16  # bodies of max_request_bytes the server holds at once


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


def client_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The API key a request presents (Authorization: Bearer, or Anthropic's x-api-key)."""
    auth = authorization or ""
    return auth[7:] if auth[:7].lower() == "bearer " else x_api_key


class RequestGuard:
    def __init__(self, app: ASGIApp, options: ServerOptions, on_reject: Callable[[str], None] = lambda reason: None):
        self.app = app
        self.on_reject = on_reject  # each refusal's reason, for /metrics
        self.key = options.api_key.encode() if options.api_key else None
        self.max_bytes = options.max_request_bytes
        self.body_timeout = options.body_timeout_s
        # All bodies held at once, from their first byte to the end of their request: many
        # clients sending large bodies together get 503 instead of growing the server's memory.
        self.budget = _BODY_BUDGET_REQUESTS * self.max_bytes
        self.held = 0

    def authorized(self, scope: Scope) -> bool:
        key = client_key(_header(scope, b"authorization"), _header(scope, b"x-api-key"))
        # Constant time, so the key cannot be found a byte at a time by timing the 401s.
        return key is not None and hmac.compare_digest(key.encode(), self.key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if (self.key is not None and path not in OPEN_PATHS and not path.startswith("/static/") and scope["method"] != "OPTIONS"
                and not self.authorized(scope)):
            self.on_reject("unauthorized")
            await json_error(path, 401, "Invalid or missing API key.")(scope, receive, send)
            return
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        # A 413 keeps the connection: closing it while the client still sends would reset it and
        # lose the response; the protocol discards the rest of the body (for body_timeout_s at most).
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            self.on_reject("body_too_large")
            await json_error(path, 413, f"request body of {declared} bytes exceeds {self.max_bytes}")(scope, receive, send)
            return
        held = [0]  # bytes of this body counted in self.held until the request ends
        try:
            try:
                body = await asyncio.wait_for(self._read_body(receive, held), self.body_timeout)
            except _TooLarge:
                self.on_reject("body_too_large")
                await json_error(path, 413, f"request body exceeds {self.max_bytes} bytes")(scope, receive, send)
                return
            except _Busy:
                self.on_reject("bodies_held")
                await json_error(path, 503, "the server holds too many request bodies at once; retry later",
                                 headers={"Retry-After": "1", "connection": "close"})(scope, receive, send)
                return
            except asyncio.TimeoutError:
                self.on_reject("body_timeout")
                await json_error(path, 408, f"request body not received within {self.body_timeout:g} s",
                                 headers={"connection": "close"})(scope, receive, send)
                return
            except _Disconnected:
                return
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.held -= held[0]

    async def _read_body(self, receive: Receive, held: list[int]) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge()
            held[0] += len(chunk)
            self.held += len(chunk)
            if self.held > self.budget:
                raise _Busy()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the client's disconnect

    return replay
