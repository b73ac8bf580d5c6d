"""Option schema, launch profiles and their resolution order, startup errors, clean shutdown."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import sys

import httpx
import pytest

from revolta.profiles import ConfigError, available_profiles, load_profile, resolve
from server_fixture import ServerProcess


def test_cpu_demo_profile_is_valid():
    assert "cpu-demo" in available_profiles()
    values = load_profile("cpu-demo")
    assert values["device"] == "cpu"


def test_resolution_order(monkeypatch):
    monkeypatch.setenv("REVOLTA_MAX_NUM_SEQS", "7")
    monkeypatch.setenv("REVOLTA_PORT", "9001")
    settings, report = resolve({"port": 9002}, profile="cpu-demo")
    assert settings.server.port == 9002 and report["port"]["source"] == "cli"
    assert settings.engine.max_num_seqs == 7 and report["max_num_seqs"]["source"] == "env"
    assert settings.engine.dtype == "bfloat16" and report["dtype"]["source"] == "profile:cpu-demo"
    assert report["block_size"] == {"value": 16, "source": "default"}
    monkeypatch.setenv("REVOLTA_BLOCK_ACTIVATION_BITS", "8")
    assert resolve({})[0].engine.block_activation_bits == 8  # (text from the environment or a flag)


def test_invalid_values_name_the_option(tmp_path):
    with pytest.raises(ConfigError, match="max_num_seqs"):
        resolve({"max_num_seqs": 0})
    with pytest.raises(ConfigError, match="block_size"):
        resolve({"block_size": 24})
    with pytest.raises(ConfigError, match="tool_call_parser"):
        resolve({"tool_call_parser": "nope"})
    with pytest.raises(ConfigError, match="chat_template.*no file 'nowhere.jinja'"):
        resolve({"chat_template": "nowhere.jinja"})
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }}")
    with pytest.raises(ConfigError, match="chat_template.*does not parse"):
        resolve({"chat_template": str(broken)})
    with pytest.raises(ConfigError, match="block_activation_bits"):
        resolve({"block_activation_bits": "12"})
    with pytest.raises(ConfigError, match="unknown option.*max_sequences"):
        resolve({"max_sequences": 4})
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  kv_cache_memory_bytes: -5\n")
    with pytest.raises(ConfigError, match="kv_cache_memory_bytes"):
        load_profile(str(bad))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "revolta.server.cli", *args], capture_output=True, text=True, timeout=120)


def test_startup_errors_before_any_weight_is_read(tmp_path):
    r = run_cli("--max-num-seqs", "0")
    assert r.returncode == 2 and "max_num_seqs" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("--model", str(tmp_path / "missing"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_cli("--profile", "no-such-profile")
    assert r.returncode == 2 and "cpu-demo" in r.stderr  # lists the available ones
    r = run_cli("--kv-cache-memory-bytes", "1000")
    assert r.returncode == 2 and "kv_cache_memory_bytes" in r.stderr


def test_default_model_and_sigterm(demo_model_dir):
    # no --model: the demo model; debug logging shows every option and its source
    srv = ServerProcess("--profile", "cpu-demo", "--max-model-len", "1024", "--log-level", "debug")
    try:
        models = httpx.get(srv.url + "/v1/models").json()["data"]
        assert models[0]["id"] == "SmolLM2-135M-Instruct" and models[0]["max_model_len"] == 1024
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=30) == 0
    finally:
        log = srv.stop()
    assert "Traceback" not in log and f"serving SmolLM2-135M-Instruct at {srv.url}" in log
    line = next(l for l in log.splitlines() if "resolved_config" in l)
    report = json.loads(line[line.index("{"):])["options"]
    assert report["max_model_len"] == {"value": 1024, "source": "cli"}
    assert report["dtype"]["source"] == "profile:cpu-demo"


def signal_after(marker: str, sig: int, delay: float = 0.0) -> tuple[int, str]:
    """The demo server started, sent `sig` `delay` s after it logs a line holding `marker`; its exit
    status and output."""
    p = subprocess.Popen([sys.executable, "-m", "revolta.server.cli", "--profile", "cpu-demo", "--port", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if marker in line:
            time.sleep(delay)
            p.send_signal(sig)
            break
    out = "".join(seen) + p.communicate(timeout=60)[0]
    return p.returncode, out


def test_cli_help_version_and_early_signals():
    r = run_cli("--help")
    assert r.returncode == 0
    for section in ("Model:", "Device and memory:", "Scheduling and caching:", "KV offload:", "Server:", "CORS:"):
        assert section in r.stdout
    assert "{cpu,cuda}" in r.stdout and "{qwen3_coder,hermes}" in r.stdout and "default: 2048" in r.stdout
    assert "cpu-demo: The embedded demo model" in " ".join(r.stdout.split())  # --profile lists the profiles
    assert run_cli("--version").stdout.startswith("revolta-server ")
    r = run_cli("--device", "tpu")
    assert r.returncode == 2 and "invalid choice: 'tpu'" in r.stderr
    r = run_cli("--device", "cuda", "--dtype", "bfloat16")
    assert r.returncode == 2 and "Value error" not in r.stderr and "settings:" not in r.stderr
    # A signal while the server's modules import or the model loads ends it with one line, no
    # traceback (one landing inside an import's native code once came out as a pydantic
    # SchemaError, or as a death by SIGINT): sent as soon as the options are resolved, and later.
    for sig, delay in [(signal.SIGTERM, 0.0), (signal.SIGINT, 0.05), (signal.SIGTERM, 0.15)]:
        code, out = signal_after("profile cpu-demo", sig, delay)
        assert code == 130 and "interrupted before it was serving" in out and "Traceback" not in out, out
    # Once the engine runs but before the server does, the signal must still stop the engine's thread
    # (left running into interpreter exit, it aborted the process).
    code, out = signal_after("admission:", signal.SIGTERM)
    assert code in (0, 130) and "Traceback" not in out and "terminate called" not in out, out
