"""The connection limits of revolta-server's HTTP/1.1 protocol, on a real socket with a plain app
that streams without end (no model: the limits live below the app)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn

from revolta.config import ServerOptions
from revolta.server.connection import guarded_protocol


class Endless:
    """Streams 64 KB chunks until the client goes (watching receive() for the disconnect, as
    Starlette's StreamingResponse does); records when it saw the disconnect."""

    def __init__(self):
        self.sent = 0
        self.gone_at: float | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        await receive()  # the (empty) request body

        async def stream():
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            while True:
                await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
                self.sent += 65536

        task = asyncio.ensure_future(stream())
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone_at = time.time()
        task.cancel()


def start(app, **limits):
    opts = ServerOptions(**limits)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    config = uvicorn.Config(app, http=guarded_protocol(opts), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, sock.getsockname()[1]


def test_client_that_never_reads_is_dropped():
    """Its stream fills the socket buffers and the transport's; write_timeout_s later the
    connection is aborted, and the app sees the disconnect (an engine request would be aborted)."""
    app = Endless()
    server, thread, port = start(app, write_timeout_s=1.0)
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.time() + 20
        while app.gone_at is None and time.time() < deadline:
            time.sleep(0.05)
        assert app.gone_at is not None, f"still streaming after 20 s ({app.sent} bytes sent)"
        s.settimeout(5)
        got = 0
        try:
            while (data := s.recv(1 << 20)):
                got += len(data)
        except ConnectionResetError:
            pass
        assert got < app.sent  # the rest was dropped with the connection, not delivered late
    finally:
        server.should_exit = True
        thread.join(10)
