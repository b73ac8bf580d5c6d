"""Development endpoints (--dev-mode: /reset_prefix_cache, /server_info; /sleep and /wake_up are in
test_sleep_mode.py) and the engine watchdog (--watchdog-config), which a step made to hang
(REVOLTA_FAULT_INJECT=hang:TOKEN:SECONDS) sets off: a dump with the engine thread's activity and
every thread's stack, /health unhealthy, then healthy again once steps run."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from server_fixture import ServerProcess

LONG = [{"role": "user", "content": "Tell me about the history of Paris, from Roman times to today. " * 3}]
HANG_TOKEN = 4321


@pytest.fixture(scope="module")
def dev(demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--max-model-len", "512",
                        "--kv-cache-memory-bytes", str(32 << 20), "--dev-mode")
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log


def test_server_info_and_prefix_cache_reset(dev):
    info = httpx.get(dev.url + "/server_info").json()
    assert info["config"]["engine"]["max_model_len"] == 512 and info["model"]["architecture"] == "LlamaForCausalLM"
    assert info["default_sampling"] == {"temperature": 0.2, "top_p": 0.9} and info["engine"]["is_sleeping"] is False
    client = openai.OpenAI(base_url=dev.url + "/v1", api_key="x", max_retries=0)
    cached = []
    for reset in (False, True):
        client.chat.completions.create(model="smol", messages=LONG, max_tokens=1)
        if reset:
            assert httpx.post(dev.url + "/reset_prefix_cache").status_code == 200
        r = client.chat.completions.create(model="smol", messages=LONG, max_tokens=1)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] >= 48 and cached[1] == 0, cached


def test_dev_endpoints_are_off_by_default(demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--max-model-len", "256", "--kv-cache-memory-bytes", str(16 << 20))
    try:
        assert httpx.post(srv.url + "/sleep").status_code == 404
        assert httpx.get(srv.url + "/server_info").status_code == 404
    finally:
        srv.stop()


def test_watchdog_dumps_stacks_and_reports_a_stalled_engine(demo_model_dir, tmp_path):
    cfg = {"timeout_s": 1, "check_interval_s": 0.2, "dump_dir": str(tmp_path)}
    srv = ServerProcess("--model", demo_model_dir, "--max-model-len", "256", "--kv-cache-memory-bytes", str(16 << 20),
                        "--watchdog-config", json.dumps(cfg), env={"REVOLTA_FAULT_INJECT": f"hang:{HANG_TOKEN}:5"})
    try:
        assert httpx.get(srv.url + "/health").status_code == 200
        done = []
        t = threading.Thread(target=lambda: done.append(httpx.post(
            srv.url + "/v1/completions", json={"prompt": [1, 2, HANG_TOKEN, 3], "max_tokens": 1}, timeout=60).status_code))
        t.start()
        deadline, health = time.time() + 4.5, None
        while time.time() < deadline:
            health = httpx.get(srv.url + "/health")
            if health.status_code == 503:
                break
            time.sleep(0.1)
        assert health.status_code == 503 and health.json()["status"] == "stalled", health.text
        assert "forward" in health.json()["error"]
        (dump,) = tmp_path.glob("revolta-stall-*.txt")
        text = dump.read_text()
        assert text.startswith("engine thread: step ") and "forward (1 requests)" in text
        assert "Python threads:" in text and text.count("Thread 0x") >= 3  # main, pump, watchdog at least
        t.join(30)
        assert done == [200]
        deadline = time.time() + 5
        while time.time() < deadline and httpx.get(srv.url + "/health").status_code != 200:
            time.sleep(0.1)
        assert httpx.get(srv.url + "/health").status_code == 200
    finally:
        log = srv.stop()
    assert "watchdog: no progress for" in log and "watchdog: the engine runs steps again" in log


def test_watchdog_options_are_checked(demo_model_dir):
    from revolta.server.watchdog import parse_watchdog

    with pytest.raises(ValueError, match="watchdog_config: unknown key"):
        parse_watchdog({"timeout": 3})
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        parse_watchdog('{"timeout_s": 0}')
    assert parse_watchdog('{"timeout_s": 5}')["check_interval_s"] == 10.0
