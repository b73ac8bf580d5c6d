"""The Python examples in examples/ run as a user would run them: the offline one on the demo model,
the SDK ones against a real server; each exits 0 and prints what it says it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from server_fixture import ServerProcess

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(name: str, *args: str) -> str:
    r = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def server(demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 << 20),
                        "--tool-call-parser", "hermes")
    yield srv
    srv.stop()


def test_offline_example():
    out = run("offline.py")
    assert "default sampling: {'temperature': 0.2, 'top_p': 0.9}" in out and "chat:" in out


def test_sdk_examples(server):
    out = run("openai_client.py", "--base-url", server.url + "/v1")
    call = out.splitlines()[-1]
    assert call.startswith("tool call: get_weather {")
    out = run("anthropic_client.py", "--base-url", server.url, "--model", "SmolLM2-135M-Instruct")
    assert "in /" in out.splitlines()[0]
    out = run("structured_output.py", "--base-url", server.url + "/v1")
    value = json.loads(out.strip().splitlines()[-1])
    assert set(value) == {"name", "age"}
