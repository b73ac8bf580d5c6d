"""The playground's image attachment in a real headless Chromium: an image picked in the form goes
with the question as a data URL, the user's message shows it, the server's vision tower encodes it
(its /metrics count) and the answer streams back; the attachment is cleared for the next turn."""

from __future__ import annotations

import base64
import io
import re

import httpx
import pytest

from browser import headless
from server_fixture import ServerProcess

pytest.importorskip("torch")
from tiny_vl import make_model, picture  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("vl_playground")
    make_model(d)
    srv = ServerProcess("--model", str(d), "--served-model-name", "vl", "--max-model-len", "256", "--dtype", "float32",
                        "--kv-cache-memory-bytes", str(8 << 20))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    yield from headless()


def encoded(metrics: str) -> float:
    m = re.search(r"^revolta:mm_items_encoded (\S+)$", metrics, re.M)
    return float(m.group(1)) if m else -1.0


def test_an_attached_image_reaches_the_vision_tower(server, browser):
    b = browser
    buf = io.BytesIO()
    picture(5, 40, 48).save(buf, format="PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    assert encoded(httpx.get(server.url + "/metrics").text) == 0.0
    b.goto(server.url + "/")
    b.wait(lambda: b.eval("document.getElementById('model').value") == "vl", what="the model list")
    b.eval("(() => { const bytes = Uint8Array.from(atob('" + data + "'), (c) => c.charCodeAt(0)); "
           "const dt = new DataTransfer(); dt.items.add(new File([bytes], 'cat.png', {type: 'image/png'})); "
           "document.getElementById('image').files = dt.files; "
           "document.getElementById('max-tokens').value = '4'; "
           "document.getElementById('prompt').value = 'What is in the picture?'; "
           "document.getElementById('ask').requestSubmit(); return true; })()")
    b.wait(lambda: b.eval("(() => { const m = [...document.querySelectorAll('.msg.assistant, .msg.error')].pop(); "
                          "return m ? m.dataset.state : null; })()") == "done", what="the answer")
    assert b.eval("document.querySelector('.msg.user img').src.startsWith('data:image/png;base64,')") is True
    assert b.eval("document.getElementById('image').files.length") == 0
    assert encoded(httpx.get(server.url + "/metrics").text) == 1.0
    # a text turn after it: the image stays in the history (re-sent, found in the encoder cache)
    b.eval("document.getElementById('prompt').value = 'And now?'; document.getElementById('ask').requestSubmit(); true")
    b.wait(lambda: b.eval("[...document.querySelectorAll('.msg.assistant')].length") == 2
           and b.eval("[...document.querySelectorAll('.msg.assistant')].pop().dataset.state") == "done", what="the second answer")
    assert encoded(httpx.get(server.url + "/metrics").text) == 1.0
