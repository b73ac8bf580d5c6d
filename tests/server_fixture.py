"""Starts a real revolta-server process on 127.0.0.1 with a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "revolta.server.cli", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.log = open(os.devnull, "w") if os.environ.get("REVOLTA_TEST_QUIET") else None
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not become healthy")

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.stdout.read() if self.proc.stdout else ""


def qwen_parsers_client(path, name: str, kv_bytes: int, tool_parser: str):
    """For a module fixture (`yield from`): an openai client of revolta-server on `path` with the
    qwen3 reasoning parser and `tool_parser`; the server's log must hold no traceback at the end."""
    import openai

    srv = ServerProcess("--model", str(path), "--served-model-name", name, "--max-model-len", "1024",
                        "--kv-cache-memory-bytes", str(kv_bytes), "--reasoning-parser", "qwen3",
                        "--tool-call-parser", tool_parser)
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    log = srv.stop()
    assert "Traceback" not in log, log
