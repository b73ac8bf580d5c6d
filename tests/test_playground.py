"""The chat playground at / in a real headless Chromium (Debian's `chromium`; CI installs it): a
typed question gets a streamed answer with a tokens/s readout, and the stop button ends a long
answer (the text stops growing, the buttons come back). REVOLTA_PLAYGROUND_SCREENSHOT=PATH also
saves a screenshot there (the README's)."""

from __future__ import annotations

import json
import os
import re
import time

import httpx
import pytest

from browser import Browser, headless
from conftest import readme_question
from server_fixture import ServerProcess

KEY = "playground-key"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--max-model-len", "1024",
                        "--kv-cache-memory-bytes", str(64 << 20), "--api-key", KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    yield from headless()


def last_reply(b: Browser, field: str):
    return b.eval(f"(() => {{ const m = [...document.querySelectorAll('.msg.assistant, .msg.error')].pop(); "
                  f"return m ? m.{field} : null; }})()")


def test_playground_streams_an_answer_and_stops_a_long_one(server, browser):
    b = browser
    assert httpx.get(server.url + "/").status_code == 200  # open page, though the API needs the key
    b.goto(server.url + "/")
    b.eval(f"document.getElementById('api-key').value = '{KEY}'; "
           "document.getElementById('api-key').dispatchEvent(new Event('change')); true")
    b.wait(lambda: b.eval("document.getElementById('model').value") == "smol", what="the model list")
    b.eval("document.getElementById('temperature').value = '0'; "
           f"document.getElementById('prompt').value = {json.dumps(readme_question())}; "
           "document.getElementById('ask').requestSubmit(); true")
    b.wait(lambda: last_reply(b, "dataset.state") == "done", what="the answer")
    assert "Paris" in last_reply(b, "textContent")
    status = b.eval("document.getElementById('status').textContent")
    assert re.search(r"\d+ tokens, [\d.]+ tok/s, first token after \d+ ms, stop", status), status
    shot = os.environ.get("REVOLTA_PLAYGROUND_SCREENSHOT")
    if shot:
        b.screenshot(shot)

    b.eval("document.getElementById('max-tokens').value = '600'; "
           "document.getElementById('prompt').value = 'Write a very long story about a lighthouse keeper.'; "
           "document.getElementById('ask').requestSubmit(); true")
    b.wait(lambda: last_reply(b, "dataset.state") == "streaming" and len(last_reply(b, "textContent")) > 40,
           what="the story to start")
    assert b.eval("document.getElementById('send').disabled") is True
    b.eval("document.getElementById('stop').click(); true")
    b.wait(lambda: last_reply(b, "dataset.state") == "stopped", what="the stop")
    length = len(last_reply(b, "textContent"))
    time.sleep(1.0)
    assert len(last_reply(b, "textContent")) == length
    assert b.eval("document.getElementById('stop').disabled") is True
    assert b.eval("document.getElementById('send').disabled") is False
    assert "stopped" in b.eval("document.getElementById('status').textContent")
    # The server ended the request when the browser dropped the stream.
    b.wait(lambda: 'finished_reason="abort"' in httpx.get(server.url + "/metrics").text and any(
        line.startswith('revolta:request_success_total{finished_reason="abort"') and not line.endswith(" 0.0")
        for line in httpx.get(server.url + "/metrics").text.splitlines()), timeout=20, what="the abort on the server")
