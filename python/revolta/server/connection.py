"""uvicorn's HTTP/1.1 connection with the limits a proxy in front of it would set.

uvicorn times out only idle keep-alive connections. Here a connection is also closed when its
request head does not arrive in time (slow or half-sent headers), when its client has read
nothing of the response for a while (the stream behind it is then aborted as for any
disconnect), when it goes on sending a body that was refused (HTTP 413: the rest is read and
discarded, as a lingering close does, for body_timeout_s at most), and at once when the server
already holds its limit of connections.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from revolta.config import ServerOptions

log = logging.getLogger("revolta.server")


def guarded_protocol(options: ServerOptions) -> type[H11Protocol]:
    """The protocol class for uvicorn.Config(http=...), with these options' limits."""

    class GuardedH11Protocol(_GuardedH11Protocol):
        max_connections = options.max_connections
        header_timeout = options.header_timeout_s
        write_timeout = options.write_timeout_s
        linger_timeout = options.body_timeout_s

    return GuardedH11Protocol


class _GuardedH11Protocol(H11Protocol):
    max_connections: int
    header_timeout: float
    write_timeout: float
    linger_timeout: float
    _head_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None
    _linger_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.warning("connection limit (%d) reached: closing a new connection", self.max_connections)
            transport.abort()
            return
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # a request head has begun and not ended
            self._cancel("_linger_timer")
            if self._head_timer is None:
                self._arm_head_timer()
        else:
            self._cancel("_head_timer")

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.SEND_BODY:  # answered before its body ended
            self._linger_timer = self.loop.call_later(self.linger_timeout, self._drop, "kept sending a refused body")

    def connection_lost(self, exc: Exception | None) -> None:
        for name in ("_head_timer", "_write_timer", "_linger_timer"):
            self._cancel(name)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._drop, "read nothing of its response")

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel("_write_timer")

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout, self._drop, "sent no complete request head")

    def _cancel(self, name: str) -> None:
        timer = getattr(self, name)
        if timer is not None:
            timer.cancel()
            setattr(self, name, None)

    def _drop(self, why: str) -> None:
        if not self.transport.is_closing():
            log.info("dropping a client that %s in time", why)
            # abort(), not close(): close() would wait for a write buffer the client never reads.
            self.transport.abort()
