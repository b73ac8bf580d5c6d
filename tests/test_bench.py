"""The engine benchmark runs end to end (on the CPU here, with made-up weights of a real shape
cut to one layer), so it cannot rot where no GPU runs it."""

import json
import subprocess
import sys
from pathlib import Path

import revolta


def test_revolta_bench_runs_and_reports():
    exe = Path(revolta.__file__).parent / "bin" / "revolta_bench"
    assert exe.is_file()
    proc = subprocess.run([str(exe), "--shape", "llama-1b", "--layers", "1", "--device", "cpu", "--concurrency", "1,2",
                           "--prefill", "32", "--prompt", "8", "--decode", "4", "--max-model-len", "96"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.split("JSON ", 1)[1])
    assert report["shape"] == "llama-1b" and report["device"] == "cpu" and report["max_model_len"] == 96
    assert [d["concurrency"] for d in report["decode"]] == [1, 2]
    assert all(d["tok_s"] > 0 and d["bytes_per_step"] > 2e8 for d in report["decode"])
    assert all(d["graph_steps"] == 0 for d in report["decode"])  # the CPU records no graphs
    assert report["prefill"][0]["tokens"] == 32 and report["prefill"][0]["tok_s"] > 0


def test_revolta_bench_rejects_an_unknown_shape():
    exe = Path(revolta.__file__).parent / "bin" / "revolta_bench"
    proc = subprocess.run([str(exe), "--shape", "llama-70b"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--shape" in proc.stderr


def test_revolta_bench_rejects_a_context_limit_below_its_runs():
    exe = Path(revolta.__file__).parent / "bin" / "revolta_bench"
    args = ["--shape", "llama-1b", "--layers", "1", "--device", "cpu", "--prefill", "64", "--prompt", "8", "--decode", "4"]
    proc = subprocess.run([str(exe), *args, "--max-model-len", "32"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--max-model-len 32" in proc.stderr and "80" in proc.stderr


def test_probe_summary_groups_blocks_into_launches(tmp_path):
    """The probe log's reader (benchmarks/probe_summary.py): records of one block are consecutive,
    blocks of a launch start close together, a launch ends where a block id repeats."""
    rows = ["kind,point,block,time_ns"]
    t = 10_000_000
    for launch in range(3):
        for kind, blocks, marks in ((3, 4, {0: 0, 1: 1500, 2: 2500, 11: 4000}),
                                    (2, 6, {0: 0, 1: 1000, 3: 3000, 11: 18000})):
            for b in reversed(range(blocks)):  # blocks log in any order
                rows += [f"{kind},{p},{b},{t + 100 * b + dt}" for p, dt in marks.items()]
            t += max(marks.values()) + 100 * blocks + 1000
    rows += [f"3,0,0,{t}", f"3,1,0,{t + 1500}"]  # a fourth launch's block, cut off by a full log before its exit
    path = tmp_path / "probe.csv"
    path.write_text("\n".join(rows) + "\n")
    script = Path(__file__).parent.parent / "benchmarks" / "probe_summary.py"
    proc = subprocess.run(["python3", str(script), str(path), "--launches", "4"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "moe_route_experts: 3 launches" in out and "gemv_row: 3 launches" in out  # not a fourth
    # gemv_row's wait: its first block 1.5 us after the launch started, its last (block 3) 0.3 us later
    gemv = out.split("gemv_row: 3 launches")[1]
    wait = next(l for l in gemv.splitlines() if l.strip().startswith("wait returned")).split()
    assert wait[-3:] == ["1.50", "1.65", "1.80"]
    timeline = out.split("first 4 launches")[1].splitlines()[2:6]
    assert [l.split()[0] for l in timeline] == ["gemv_row", "moe_route_experts"] * 2
    # the moe launch started 1.0 us after the gemv's last block (at 4.3 us) left; its first wait 1.0 us later
    assert timeline[1].split()[1:] == ["5.40", "6.40", "6.90", "23.90", "2.10"]


def test_probe_summary_names_the_late_blocks(tmp_path):
    """--late: block 2 of six returns from its wait 0.7 us behind its place in every launch, so it
    is the latest each time and 0.55 us behind the launch's median block (1.90 against 1.35 us)."""
    rows = ["kind,point,block,time_ns"]
    t = 10_000_000
    for launch in range(3):
        for b in range(6):
            wait = 1000 + 100 * b + (700 if b == 2 else 0)
            rows += [f"2,0,{b},{t + 100 * b}", f"2,1,{b},{t + wait}", f"2,11,{b},{t + 5000}"]
        t += 10_000
    path = tmp_path / "probe.csv"
    path.write_text("\n".join(rows) + "\n")
    script = Path(__file__).parent.parent / "benchmarks" / "probe_summary.py"
    proc = subprocess.run(["python3", str(script), str(path), "--late"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("moe_route_experts / wait returned"))
    assert "latest most often 2 (3x);" in line
    assert line.split("furthest behind the median ")[1].startswith("2 (+0.55), 5 (+0.15)")


def test_serving_benchmark_runs_against_a_real_server(tmp_path):
    """benchmarks/bench_serving.py starts a server, streams a small load through it and reports
    every request: completed, with a first token before its end and as many tokens as asked."""
    import sys

    script = Path(__file__).parents[1] / "benchmarks" / "bench_serving.py"
    out = tmp_path / "serving.json"
    proc = subprocess.run([sys.executable, str(script), "--shape", "demo", "--engine", '{"max_num_seqs": 4}',
                           "--num-prompts", "6", "--request-rate", "20", "--input-len", "24", "--output-len", "6",
                           "--no-offline-peer", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fig = json.loads(out.read_text())
    assert fig["completed"] == 6 and fig["failed"] == 0
    assert fig["output_tokens"] == fig["requested_output_tokens"]  # ignore_eos: each request its max_tokens
    assert 0 < fig["ttft"]["p50_ms"] <= fig["e2e"]["p50_ms"]
    assert fig["output_tok_s"] > 0 and fig["input_tok_s"] > fig["output_tok_s"]


def test_tensor_parallel_benchmark_checks_tokens_and_reports_ratios():
    script = Path(__file__).parent.parent / "benchmarks" / "bench_tensor_parallel.py"
    proc = subprocess.run([sys.executable, str(script), "--tp", "1,3", "--concurrency", "2", "--prompt", "16", "--tokens", "6",
                           "--threads", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert [(r[0], r[1]) for r in rows] == [("1", "2"), ("3", "2")]
    assert all(float(r[2]) > 0 for r in rows) and rows[0][3] == "1.00"
    assert all("equal to tp 1" in " ".join(r) for r in rows)
