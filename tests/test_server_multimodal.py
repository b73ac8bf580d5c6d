"""Images through the real server, with the official SDKs as clients: OpenAI chat `image_url`
(a data URL; an http URL only from an allowed host; a local file only under the allowed path),
Responses `input_image`, Anthropic `image` blocks (base64 and URL), count_tokens counting the
image's tokens, and `video_url` (an MP4 file, sampled); --limit-mm-per-prompt, mm_processor_kwargs without --trust-request-mm-kwargs, and
corrupt, truncated or oversized images each a 400 naming the content part, the server serving on.
The answers are the offline engine's greedy tokens for the same image."""

from __future__ import annotations

import base64
import http.server
import io
import threading

import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
torch = pytest.importorskip("torch")

from server_fixture import ServerProcess  # noqa: E402
from tiny_vl import SPECIAL, make_model, picture  # noqa: E402


def png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("vl_server")
    make_model(d)
    media = tmp_path_factory.mktemp("media")
    (media / "cat.png").write_bytes(png(picture(21, 40, 48)))
    # a local web server: one allowed host name (localhost), one not (127.0.0.1)
    images = {"/cat.png": png(picture(21, 40, 48))}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = images.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *a):
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    srv = ServerProcess("--model", str(d), "--served-model-name", "vl", "--max-model-len", "256", "--dtype", "float32",
                        "--kv-cache-memory-bytes", str(8 << 20), "--limit-mm-per-prompt", '{"image": 2}',
                        "--allowed-media-domains", "localhost", "--allowed-local-media-path", str(media),
                        "--max-media-bytes", "200000")
    yield d, srv, media, web.server_address[1]
    web.shutdown()
    log = srv.stop()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def offline(served):
    import revolta

    with revolta.LLM(str(served[0]), dtype="float32", max_model_len=256) as llm:
        yield llm


BIAS = {str(t): -100 for t in SPECIAL}
CAT = picture(21, 40, 48)


def expected(offline, messages, n=6):
    """The offline engine's greedy answer to the same conversation (media as PIL images)."""
    import revolta

    tok = offline.get_tokenizer()
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    images = [CAT for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image"]
    sp = revolta.SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logit_bias={t: -100 for t in SPECIAL})
    out = offline.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": images}}, sp)[0]
    return out.outputs[0].text, len(out.prompt_token_ids)


def chat(srv, content, **kw):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    return c.chat.completions.create(model="vl", messages=[{"role": "user", "content": content}], max_tokens=6,
                                     temperature=0, logit_bias=BIAS, extra_body={"ignore_eos": True, **kw})


def test_openai_image_url_forms_answer_as_offline(served, offline):
    _, srv, media, port = served
    want, prompt_len = expected(offline, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}])
    for url in (data_url(png(CAT)), f"http://localhost:{port}/cat.png", (media / "cat.png").as_uri()):
        r = chat(srv, [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is it?"}])
        assert r.usage.prompt_tokens == prompt_len  # the image's tokens counted
        assert (r.choices[0].message.content or "") == want


def test_anthropic_and_responses_images(served, offline):
    _, srv, _, port = served
    raw = png(CAT)
    a = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
    blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(raw).decode()}},
              {"type": "text", "text": "What is it?"}]
    _, prompt_len = expected(offline, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}])
    m = a.messages.create(model="vl", max_tokens=6, messages=[{"role": "user", "content": blocks}])
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == prompt_len
    counted = a.messages.count_tokens(model="vl", messages=[{"role": "user", "content": blocks}])
    assert counted.input_tokens == prompt_len
    by_url = [{"type": "image", "source": {"type": "url", "url": f"http://localhost:{port}/cat.png"}}, blocks[1]]
    assert a.messages.count_tokens(model="vl", messages=[{"role": "user", "content": by_url}]).input_tokens == prompt_len
    o = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    r = o.responses.create(model="vl", max_output_tokens=6, input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(raw)}, {"type": "input_text", "text": "What is it?"}]}])
    assert r.usage.input_tokens == prompt_len


def test_video_url_answers_as_offline(served, offline):
    """A video file as a data URL: sampled, its frame groups expanded with their timestamps."""
    from tiny_vl import mp4

    _, srv, _, _ = served
    data = mp4(4)
    tok = offline.get_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}],
                                   add_generation_prompt=True)
    import revolta

    sp = revolta.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias={t: -100 for t in SPECIAL})
    want = offline.generate({"prompt_token_ids": tok.encode(text, add_special_tokens=False),
                             "multi_modal_data": {"video": [data]}}, sp)[0]
    r = chat(srv, [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()}},
                   {"type": "text", "text": "What happens?"}])
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    assert (r.choices[0].message.content or "") == want.outputs[0].text
    bad(srv, [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data[:300]).decode()}}],
        r"messages\[0\].content\[0\]: the video could not be decoded")


def bad(srv, content, match, **kw):
    with pytest.raises(openai.BadRequestError, match=match) as e:
        chat(srv, content, **kw)
    return e.value


def test_bad_media_is_a_400_naming_the_part(served):
    _, srv, media, port = served
    text = {"type": "text", "text": "hi"}
    img = lambda url: {"type": "image_url", "image_url": {"url": url}}  # noqa: E731
    raw = png(CAT)
    err = bad(srv, [text, img("data:image/png;base64,bm90IGFuIGltYWdl")], r"messages\[0\].content\[1\]: the data is not an image")
    assert err.body["param"] == "messages[0].content[1]"
    bad(srv, [img(data_url(raw[: len(raw) // 2]))], r"content\[0\]: the image could not be decoded")
    bad(srv, [img("data:image/png;base64,@@@")], "base64 payload does not decode")
    bad(srv, [img(f"http://127.0.0.1:{port}/cat.png")], "fetching media from '127.0.0.1' is not allowed")
    bad(srv, [img(f"http://localhost:{port}/missing.png")], "HTTP 404")
    bad(srv, [img("file:///etc/passwd")], "outside the allowed local media path")
    bad(srv, [img("ftp://x/y.png")], "unsupported media URL scheme")
    big = picture(3, 400, 400).tobytes()  # raw RGB bytes past --max-media-bytes
    bad(srv, [img("data:image/png;base64," + base64.b64encode(big).decode())], "more than 200000 bytes")
    bad(srv, [img(data_url(raw))] * 3, r"content\[2\]: at most 2 image\(s\) .* --limit-mm-per-prompt")
    bad(srv, [img(data_url(raw))], "mm_processor_kwargs are not accepted", mm_processor_kwargs={"max_pixels": 1024})
    bad(srv, [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}], "type 'input_audio' are not supported")
    # the server goes on
    assert chat(srv, [img(data_url(raw)), text]).choices[0].message.content is not None
