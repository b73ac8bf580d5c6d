"""A short run of benchmarks/soak.py: a mixed load of the five text endpoints, with disconnects and
bad bodies, against a real server; nothing lost or hanging, KV usage back to 0, RSS steady."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_soak():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"
    spec = importlib.util.spec_from_file_location("soak", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_short_soak(demo_model_dir, tmp_path):
    soak = load_soak()
    log = tmp_path / "server.log"
    args = soak.parse_args(["--model", demo_model_dir, "--requests", "120", "--concurrency", "8", "--max-tokens", "16",
                            "--max-model-len", "512", "--seed", "1", "--server-log", str(log)])
    report = soak.run(args)
    assert report["lost"] == 0 and report["hanging"] == 0, report["examples"]
    assert report["kv_cache_usage_after"] == 0 and report["running_after"] == 0 and report["waiting_after"] == 0
    assert report["rss_growth_after_warmup"] <= 0.10, report["rss_mb"]
    assert report["outcomes"].get("gone-stream:disconnected", 0) + report["outcomes"].get("gone-plain:disconnected", 0) > 0
    assert any(k.startswith("bad:4") for k in report["outcomes"])
    assert report["ok"] and report["server_exit_code"] == 0
    assert "Traceback" not in log.read_text()
