"""A real server's lifecycle: per-request deadlines, graceful shutdown on SIGTERM, engine steps
that fail (only their requests fail) or a device that fails (the server exits non-zero), and a
busy port found before the model loads."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from server_fixture import ServerProcess, free_port

FAULT_TOKEN = 48_000  # a token no prompt of these tests holds
LONG = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True}


def start(demo_model_dir, *args, env=None) -> ServerProcess:
    return ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--max-model-len", "2048",
                         "--kv-cache-memory-bytes", str(128 << 20), *args, env=env)


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_idle(url: str, timeout: float = 10.0) -> dict[str, float]:
    deadline = time.time() + timeout
    while True:
        m = metrics(url)
        if m["revolta:num_requests_running"] == 0 and m["revolta:kv_cache_usage_perc"] == 0:
            return m
        assert time.time() < deadline, m
        time.sleep(0.05)


def sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def in_background(fn):
    result: dict = {}

    def run():
        try:
            result["value"] = fn()
        except Exception as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, result


def test_request_timeout_ends_requests_and_counts_them_aborted(demo_model_dir):
    srv = start(demo_model_dir, "--request-timeout-s", "3")
    try:
        t0 = time.time()
        r = httpx.post(srv.url + "/v1/completions", json=LONG, timeout=30)
        assert r.status_code == 504 and "request_timeout_s" in r.json()["error"]["message"]
        assert time.time() - t0 < 10  # 1500 tokens take far longer
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=30, json={
            "model": "smol", "max_tokens": 1500, "ignore_eos": True, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        data = sse_data(r.text)
        assert json.loads(data[-2])["error"]["code"] == 504 and data[-1] == "[DONE]"
        r = httpx.post(srv.url + "/v1/messages", timeout=30, json={
            "model": "smol", "max_tokens": 1500, "stream": True, "messages": [{"role": "user", "content": "Tell a long story."}]})
        assert "event: error" in r.text and "timeout_error" in r.text
        m = wait_idle(srv.url)
        assert m['revolta:request_success_total{finished_reason="abort"}'] == 3
        ok = httpx.post(srv.url + "/v1/completions", json={**LONG, "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200  # short requests are untouched
    finally:
        assert "Traceback" not in srv.stop()


def test_sigterm_drains_then_ends_what_is_left_with_errors(demo_model_dir):
    srv = start(demo_model_dir, "--shutdown-timeout-s", "4")
    stream_t, stream = in_background(lambda: httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
        "model": "smol", "max_tokens": 1500, "ignore_eos": True, "stream": True, "messages": [{"role": "user", "content": "hi"}]}))
    plain_t, plain = in_background(lambda: httpx.post(srv.url + "/v1/completions", json=LONG, timeout=60))
    short_t, short = in_background(lambda: httpx.post(srv.url + "/v1/completions", json={**LONG, "max_tokens": 8}, timeout=60))
    deadline = time.time() + 30
    while metrics(srv.url)["revolta:num_requests_running"] < 3:
        assert time.time() < deadline
        time.sleep(0.05)
    t0 = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.ConnectError):  # no longer accepting
        httpx.get(srv.url + "/health", timeout=2)
    for t in (stream_t, plain_t, short_t):
        t.join(30)
    assert srv.proc.wait(30) == 0
    assert time.time() - t0 < 15
    assert short["value"].status_code == 200 and short["value"].json()["usage"]["completion_tokens"] == 8  # finished in the drain
    assert plain["value"].status_code == 503 and "shutting down" in plain["value"].json()["error"]["message"]
    data = sse_data(stream["value"].text)
    assert json.loads(data[-2])["error"]["code"] == 503 and data[-1] == "[DONE]"
    assert "Traceback" not in srv.stop()


def test_failing_step_fails_only_its_requests(demo_model_dir):
    srv = start(demo_model_dir, env={"REVOLTA_FAULT_INJECT": f"step:{FAULT_TOKEN}"})
    try:
        good = {"model": "smol", "prompt": [504, 3575, 282], "max_tokens": 8, "ignore_eos": True, "temperature": 0}
        before = httpx.post(srv.url + "/v1/completions", json=good, timeout=30).json()["choices"][0]["text"]
        r = httpx.post(srv.url + "/v1/completions", json={**good, "prompt": [504, FAULT_TOKEN, 282]}, timeout=30)
        assert r.status_code == 500 and "injected step fault" in r.json()["error"]["message"]
        r = httpx.post(srv.url + "/v1/completions", json={**good, "prompt": [FAULT_TOKEN], "stream": True}, timeout=30)
        data = sse_data(r.text)
        assert json.loads(data[-2])["error"]["code"] == 500 and data[-1] == "[DONE]"
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"
        after = httpx.post(srv.url + "/v1/completions", json=good, timeout=30).json()["choices"][0]["text"]
        assert after == before  # the engine goes on, its caches intact
        m = wait_idle(srv.url)
        assert m['revolta:request_success_total{finished_reason="error"}'] == 2
    finally:
        assert "Traceback" not in srv.stop()


def test_failing_device_stops_the_server_non_zero(demo_model_dir):
    srv = start(demo_model_dir, env={"REVOLTA_FAULT_INJECT": f"device:{FAULT_TOKEN}"})
    bystander_t, bystander = in_background(lambda: httpx.post(srv.url + "/v1/completions", json=LONG, timeout=60))
    time.sleep(0.5)
    r = httpx.post(srv.url + "/v1/completions", json={**LONG, "prompt": [FAULT_TOKEN]}, timeout=30)
    assert r.status_code == 500 and "injected device fault" in r.json()["error"]["message"]
    bystander_t.join(30)
    assert bystander["value"].status_code == 500  # every request in flight ends with the error
    assert srv.proc.wait(30) == 1
    log = srv.stop()
    assert "the engine failed" in log


def test_busy_port_fails_before_the_model_loads(tmp_path):
    port = free_port()
    with __import__("socket").socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        t0 = time.time()
        p = subprocess.run([sys.executable, "-m", "revolta.server.cli", "--port", str(port), "--model", str(tmp_path / "absent")],
                           capture_output=True, text=True, timeout=60)
    error = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and f"--port {port}" in error and "Address already in use" in error, p.stderr
    assert time.time() - t0 < 30
