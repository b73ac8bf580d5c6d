"""The performance gate (benchmarks/perf_gate.py) on the CPU: a figure 15% below its baseline
fails and is named, 5% below passes, a figure that stopped being measured fails, and the suite
runner reads revolta_bench's reports (a stand-in bench here, whose speed the test sets)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import perf_gate  # noqa: E402

BASE = {"llama-8b c1": 200.0, "llama-8b c8": 1000.0, "qwen3-next prefill 8K": 7000.0}


def write_baseline(path: Path, figures: dict[str, float]) -> Path:
    path.write_text(json.dumps({"gpu": "Test GPU", "lanes": {"native": {"commit": "abc", "figures": figures}}}))
    return path


def write_results(path: Path, figures: dict[str, float]) -> Path:
    path.write_text(json.dumps({"gpu": "Test GPU", "lane": "native", "figures": figures}))
    return path


def gate(tmp_path, measured, capsys):
    base = write_baseline(tmp_path / "base.json", BASE)
    res = write_results(tmp_path / "res.json", measured)
    code = perf_gate.main(["--compare", str(res), "--baseline", str(base)])
    return code, capsys.readouterr().out


def test_a_drop_of_15_percent_fails_and_names_the_figure(tmp_path, capsys):
    code, out = gate(tmp_path, {**BASE, "qwen3-next prefill 8K": 7000.0 * 0.85}, capsys)
    assert code == 1
    assert "FAILED: qwen3-next prefill 8K: 5,950.0 against 7,000.0 (-15.0%)" in out
    assert "| qwen3-next prefill 8K | 7,000.0 | 5,950.0 | -15.0% | DROP |" in out


def test_a_drop_of_5_percent_passes(tmp_path, capsys):
    code, out = gate(tmp_path, {k: v * 0.95 for k, v in BASE.items()}, capsys)
    assert code == 0 and out.rstrip().endswith("passed")


def test_a_figure_no_longer_measured_fails(tmp_path, capsys):
    code, out = gate(tmp_path, {k: v for k, v in BASE.items() if k != "llama-8b c8"}, capsys)
    assert code == 1 and "llama-8b c8: not measured" in out


def test_new_figures_and_gains_pass(tmp_path, capsys):
    code, out = gate(tmp_path, {**{k: v * 1.3 for k, v in BASE.items()}, "llama-8b c64": 2800.0}, capsys)
    assert code == 0 and "| llama-8b c64 | - | 2,800.0 | - | new |" in out


def test_the_fp16_hybrid_cases_fit_a_smaller_gpu():
    cases = {c.name: c.args for c in perf_gate.SUITE}
    for name in ("qwen3-next", "qwen3-next-mtp4"):
        small = perf_gate.fitted(cases[name], 80.0)
        assert small[small.index("--layers") + 1] == "16" and len(small) == len(cases[name])
        assert perf_gate.fitted(cases[name], 141.0) == cases[name] and perf_gate.fitted(cases[name], None) == cases[name]
    assert perf_gate.fitted(cases["qwen3-next-awq"], 80.0) == cases["qwen3-next-awq"]  # int4: 45 GB at 48 layers
    assert perf_gate.fitted(cases["llama-8b"], 80.0) == cases["llama-8b"]


FAKE_BENCH = textwrap.dedent("""\
    #!{python}
    # A stand-in for revolta_bench: tok/s = SPEED x concurrency (prefill: SPEED x 10), as its JSON line.
    import json, os, sys
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    speed = float(open(os.environ["FAKE_SPEED_FILE"]).read())
    conc = [int(c) for c in args.get("--concurrency", "1").split(",") if c]
    pre = [int(p) for p in args.get("--prefill", "").split(",") if p]
    print("a human-readable table first")
    print("JSON " + json.dumps({{"shape": args["--shape"], "gpu": "Fake GPU 80GB",
        "decode": [{{"concurrency": c, "tok_s": speed * c}} for c in conc],
        "prefill": [{{"tokens": p, "tok_s": speed * 10}} for p in pre]}}))
""")


@pytest.fixture
def fake_bench(tmp_path, monkeypatch):
    exe = tmp_path / "fake_bench"
    exe.write_text(FAKE_BENCH.format(python=sys.executable))
    exe.chmod(0o755)
    speed = tmp_path / "speed"
    monkeypatch.setenv("FAKE_SPEED_FILE", str(speed))
    return exe, speed


def test_the_suite_runner_reads_the_bench_and_gates_it(tmp_path, capsys, fake_bench):
    exe, speed = fake_bench
    base = tmp_path / "baselines" / "fake.json"
    run = ["--bench", str(exe), "--cases", "llama-8b,qwen3-next", "--baseline", str(base)]
    speed.write_text("100")
    assert perf_gate.main([*run, "--update-baseline", "--results", str(tmp_path / "r.json")]) == 0
    stored = json.loads(base.read_text())
    assert stored["gpu"] == "Fake GPU 80GB"
    assert stored["lanes"]["native"]["figures"] == {
        "llama-8b c1": 100.0, "llama-8b c8": 800.0, "llama-8b c32": 3200.0, "llama-8b c64": 6400.0,
        "qwen3-next c1": 100.0, "qwen3-next c8": 800.0, "qwen3-next c64": 6400.0,
        "qwen3-next prefill 1K": 1000.0, "qwen3-next prefill 2K": 1000.0, "qwen3-next prefill 8K": 1000.0}
    assert json.loads((tmp_path / "r.json").read_text())["figures"]["llama-8b c8"] == 800.0
    capsys.readouterr()

    speed.write_text("95")
    assert perf_gate.main(run) == 0
    speed.write_text("85")
    assert perf_gate.main(run) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "llama-8b c64: 5,440.0 against 6,400.0 (-15.0%)" in out


def test_a_failing_case_stops_the_gate(tmp_path, capsys, fake_bench):
    exe, speed = fake_bench
    speed.write_text("not a number")
    assert perf_gate.main(["--bench", str(exe), "--cases", "llama-8b", "--baseline", str(tmp_path / "b.json")]) == 2
    assert "case llama-8b failed" in capsys.readouterr().err


def test_baselines_are_named_by_gpu():
    assert perf_gate.baseline_path("NVIDIA H200 (compute capability 9.0)").name == "nvidia-h200.json"
    assert perf_gate.baseline_path("Tesla V100-SXM2-32GB").name == "tesla-v100-sxm2-32gb.json"
