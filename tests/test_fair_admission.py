"""The demo server at its defaults against one client's huge fan-out: the request that would queue
16,000 sequences is refused, and while one within the limits (100 prompts x n 16) runs, a small
chat on every text endpoint is served about as fast as on an idle server."""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time

import httpx
import pytest

from server_fixture import ServerProcess

SMALL = {"max_tokens": 4, "temperature": 0}
BIG = {"prompt": ["hi"] * 100, "n": 16, "max_tokens": 4}


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--profile", "cpu-demo")
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log
    # The limits are printed at startup: the profile's 4 running, the default queue and fan-out.
    assert "admission: 4 running (max_num_seqs) + 4096 waiting (max_waiting_requests, derived), at most 2050 per " \
           "request (max_seqs_per_request); scheduling_policy fair" in log, log


def metrics(server) -> dict[str, float]:
    out = {}
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def queued(server) -> float:
    m = metrics(server)
    return m["revolta:num_requests_running"] + m["revolta:num_requests_waiting"]


def wait_idle(server, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while queued(server) > 0:
        assert time.time() < deadline, "the engine did not drain"
        time.sleep(0.1)


class HeldRequest:
    """A POST sent over a raw socket and left unread; closing the socket is the client going away
    (the server then aborts everything the request queued)."""

    def __init__(self, server, path: str, body: dict):
        data = json.dumps(body).encode()
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\n\r\n".encode() + data)

    def close(self) -> None:
        self.sock.close()


def small_requests(server) -> dict[str, tuple[str, dict]]:
    """The same small chat through each text endpoint (completions: its templated token ids)."""
    messages = [{"role": "user", "content": "Say hi"}]
    ids = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["tokens"]
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    return {
        "chat": ("/v1/chat/completions", {"messages": messages, **SMALL, "ignore_eos": True}),
        "completions": ("/v1/completions", {"prompt": ids, **SMALL, "ignore_eos": True}),
        "responses": ("/v1/responses", {"input": messages, "max_output_tokens": 4, "temperature": 0}),
        "messages": ("/v1/messages", {"model": model, "messages": messages, **SMALL}),
    }


def latency(client: httpx.Client, url: str, body: dict, stream: bool) -> float:
    t0 = time.perf_counter()
    if stream:
        with client.stream("POST", url, json={**body, "stream": True}) as r:
            assert r.status_code == 200, r.read()
            lines = [line for line in r.iter_lines() if line]
        assert lines, "an empty stream"
    else:
        r = client.post(url, json=body)
        assert r.status_code == 200, r.text
    return time.perf_counter() - t0


def latencies(server, requests: dict, repeat: int = 3) -> dict[tuple[str, bool], float]:
    """Median latency of each endpoint, streaming and not."""
    out = {}
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for name, (path, body) in requests.items():
            for stream in (False, True):
                out[(name, stream)] = statistics.median(latency(c, path, body, stream) for _ in range(repeat))
    return out


def test_a_fan_out_beyond_the_limit_is_refused(server):
    before = metrics(server).get('revolta:requests_rejected_total{reason="request_too_large"}', 0.0)
    r = httpx.post(server.url + "/v1/completions", json={**BIG, "prompt": ["hi"] * 1000}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "n" and "16000 engine requests" in err["message"] and "max_seqs_per_request" in err["message"]
    assert metrics(server)['revolta:requests_rejected_total{reason="request_too_large"}'] == before + 1
    assert queued(server) == 0  # nothing of it reached the engine


def test_small_chats_are_served_while_a_big_request_runs(server):
    requests = small_requests(server)
    latencies(server, requests, repeat=1)  # warm-up: templates, tokenizer, prefix cache
    idle = latencies(server, requests, repeat=5)
    big = HeldRequest(server, "/v1/completions", BIG)
    try:
        deadline = time.time() + 30
        while metrics(server)["revolta:num_requests_waiting"] < 1000:  # most of its 1,600 sequences wait
            assert time.time() < deadline, "the big request was not queued"
            time.sleep(0.05)
        loaded = latencies(server, requests, repeat=5)
        m = metrics(server)
        assert m["revolta:num_requests_waiting"] > 0, "the big request ended before the measurement did"
        assert m['revolta:num_requests_waiting_by_priority{priority="0"}'] == m["revolta:num_requests_waiting"]
    finally:
        big.close()
    report = {f"{name}{' stream' if stream else ''}": f"{idle[(name, stream)]:.3f} s idle, {loaded[(name, stream)]:.3f} s loaded"
              for name, stream in idle}
    print(json.dumps(report, indent=1))
    for key in idle:
        assert loaded[key] <= 3 * idle[key], report
    wait_idle(server)  # the big request's sequences were aborted when its client went


def test_a_full_queue_answers_429_with_retry_after(server):
    m = metrics(server)
    before = m.get('revolta:requests_rejected_total{reason="queue_full"}', 0.0)
    # Two requests of the largest fan-out one may have fill what the server admits.
    r = httpx.post(server.url + "/v1/completions", json={**BIG, "n": 1, "prompt": ["hi"] * 100_000}, timeout=30)
    limit = int(r.json()["error"]["message"].split("at most ")[1].split(" ")[0])
    held = [HeldRequest(server, "/v1/completions", {**BIG, "n": 1, "prompt": ["hi"] * limit}) for _ in range(2)]
    try:
        deadline = time.time() + 60
        while queued(server) < 2 * limit - 16:  # (some may have finished already)
            assert time.time() < deadline, "the two requests were not queued"
            time.sleep(0.05)
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], **SMALL},
                       timeout=30)
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["type"] == "rate_limit_error"
        assert metrics(server)['revolta:requests_rejected_total{reason="queue_full"}'] == before + 1
    finally:
        for h in held:
            h.close()
    wait_idle(server)


def test_priority_needs_the_priority_policy(server):
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}], "priority": -5, **SMALL}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
    assert "--scheduling-policy priority" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}], "priority": 0, **SMALL}, timeout=30)
    assert r.status_code == 200
