"""The engine benchmark runs end to end (on the CPU here, with made-up weights of a real shape
cut to one layer), so it cannot rot between GPU sessions."""

import json
import subprocess
from pathlib import Path

import revolta


def test_revolta_bench_runs_and_reports():
    exe = Path(revolta.__file__).parent / "bin" / "revolta_bench"
    assert exe.is_file()
    proc = subprocess.run([str(exe), "--shape", "llama-1b", "--layers", "1", "--device", "cpu", "--concurrency", "1,2",
                           "--prefill", "32", "--prompt", "8", "--decode", "4"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.split("JSON ", 1)[1])
    assert report["shape"] == "llama-1b" and report["device"] == "cpu"
    assert [d["concurrency"] for d in report["decode"]] == [1, 2]
    assert all(d["tok_s"] > 0 and d["bytes_per_step"] > 2e8 for d in report["decode"])
    assert all(d["graph_steps"] == 0 for d in report["decode"])  # the CPU records no graphs
    assert report["prefill"][0]["tokens"] == 32 and report["prefill"][0]["tok_s"] > 0


def test_revolta_bench_rejects_an_unknown_shape():
    exe = Path(revolta.__file__).parent / "bin" / "revolta_bench"
    proc = subprocess.run([str(exe), "--shape", "llama-70b"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--shape" in proc.stderr
