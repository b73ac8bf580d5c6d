"""The README's snippets, run as a reader would: its server command (the demo profile) serves its
curl request and every Python block of the server section, one after another in one namespace,
against that server; the Python section's offline block runs on the demo too. A snippet that
raises or prints nothing fails."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import httpx
import pytest

from server_fixture import ServerProcess

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
DEFAULT_URL = "http://127.0.0.1:8000"


def section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.fixture(scope="module")
def server():
    serve = section("Run the server")
    command = re.search(r"revolta-server (--profile \S+)", serve).group(1)
    srv = ServerProcess(*shlex.split(command))
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log
    # The startup time, and the first answer's, are in the log.
    assert re.search(r"ready \d+\.\d s after start \(model and engine \d+\.\d s\)", log), log
    assert re.search(r"first answer \d+\.\d s after revolta-server started", log), log


def test_the_server_command_is_the_one_the_readme_gives():
    first = section("Run the server").split("\n\n")[1].strip()
    assert first.startswith("python3 -m venv .venv") and first.endswith("revolta-server --profile cpu-demo"), first


def test_curl_request(server):
    text = section("Run the server")
    line = re.search(r"^ {4}curl .*?(?<!\\)$", text, re.S | re.M).group(0).replace("\\\n", " ")
    args = shlex.split(line)
    url = next(a for a in args if a.startswith("http")).replace(DEFAULT_URL, server.url)
    headers = dict(h.split(": ", 1) for h in (args[i + 1] for i, a in enumerate(args) if a == "-H"))
    body = json.loads(args[args.index("-d") + 1])
    r = httpx.post(url, headers=headers, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]


def test_server_section_python_blocks(server):
    blocks = python_blocks(section("Run the server"))
    assert len(blocks) >= 3  # streaming, structured output, a forced tool call
    namespace: dict = {}
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block.replace(DEFAULT_URL, server.url), "README.md", "exec"), namespace)  # noqa: S102
        assert out.getvalue().strip(), block


def test_offline_python_block():
    (block,) = python_blocks(section("Python"))
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102
    namespace["llm"].shutdown()
    assert len(out.getvalue().strip().splitlines()) >= 2, out.getvalue()


def test_images_section_block(tmp_path):
    """The Images section's server command on a tiny checkpoint with a vision tower, and its SDK
    snippet against that server."""
    pytest.importorskip("torch")
    from tiny_vl import make_model

    make_model(tmp_path)
    text = section("Images and video")
    command = re.search(r"^ {4}revolta-server (.*)$", text, re.M).group(1).replace("path/to/qwen3_5_checkpoint", str(tmp_path))
    srv = ServerProcess(*shlex.split(command), "--max-model-len", "512", "--kv-cache-memory-bytes", str(8 << 20))
    try:
        (block,) = python_blocks(text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block.replace(DEFAULT_URL, srv.url), "README.md", "exec"), {})  # noqa: S102
        assert re.search(r" \d+$", out.getvalue().strip()), out.getvalue()  # the answer, then the prompt's tokens
    finally:
        log = srv.stop()
    assert "Traceback" not in log, log
