"""The performance gate: a fixed GPU suite (revolta_bench with made-up weights of real shapes, and
the torch decode peer in the same run), each figure compared with the baseline kept for this GPU
and build lane in benchmarks/baselines/. A figure more than --tolerance (10%) below its baseline
fails the gate and is named; the baseline moves only with --update-baseline (commit the file with
the reason in the message). Run it on the GPU machine after any change under cpp/ or cuda/.

    python benchmarks/perf_gate.py [--bench BUILD/revolta_bench] [--lane native|sm70] [--cases a,b]
                                   [--results OUT.json] [--update-baseline]
    python benchmarks/perf_gate.py --compare RESULTS.json [--baseline FILE]   (no GPU: compare only)

Exit status: 0 passed, 1 a figure dropped (or is missing), 2 the suite could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASELINES = HERE / "baselines"
# The forced acceptance of the MTP case: a head that accepts each draft position with p = 0.83 after
# the previous one accepts p + p^2 + p^3 + p^4 = 2.57 drafts of 4 a step (about the seed's MTP4).
MTP4_ACCEPTED = sum(0.83 ** j for j in range(1, 5))
DECODE = ["--prompt", "960", "--decode", "32"]  # a 1K-token context


@dataclass
class Case:
    name: str  # the figures' prefix
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)


SUITE = [
    Case("llama-8b", ["--shape", "llama-8b", "--concurrency", "1,8,32,64", *DECODE, "--prefill", ","]),
    Case("qwen3-next", ["--shape", "qwen3-next-80b", "--layers", "32", "--concurrency", "1,8,64", *DECODE,
                        "--prefill", "1024,2048,8192"]),
    Case("qwen3-next-awq", ["--shape", "qwen3-next-80b", "--layers", "48", "--quantization", "awq",
                            "--concurrency", "1,8", *DECODE, "--prefill", ","]),
    Case("llama-8b-fp8kv", ["--shape", "llama-8b", "--kv-cache-dtype", "fp8", "--concurrency", "16", *DECODE,
                            "--prefill", ","]),
    # k = 4 against the qwen3-next case's plain decode (k = 0) at the same context limit
    Case("qwen3-next-mtp4", ["--shape", "qwen3-next-80b", "--layers", "32", "--speculative-method", "mtp",
                             "--num-speculative-tokens", "4", "--concurrency", "1,8", *DECODE, "--prefill", ",",
                             "--max-model-len", "8208"],
         env={"REVOLTA_FAULT_INJECT": f"accept-drafts:{MTP4_ACCEPTED:.3f}"}),
]
PEER = Case("torch-peer", ["--batches", "1,8,32,64", "--context", "1024"])
CASES = [c.name for c in SUITE] + [PEER.name]


def figures_of(case: str, report: dict) -> dict[str, float]:
    """tok/s figures of one revolta_bench report, named '<case> cN' and '<case> prefill NK'."""
    out = {f"{case} c{d['concurrency']}": float(d["tok_s"]) for d in report.get("decode", [])}
    for p in report.get("prefill", []):
        n = int(p["tokens"])
        out[f"{case} prefill {n // 1024}K" if n % 1024 == 0 else f"{case} prefill {n}"] = float(p["tok_s"])
    return out


# The fp16 Qwen3-Next cases hold 102 GB of weights at 32 layers: a GPU with less memory runs them at 16
# (the baseline is per GPU, so its figures are always of the same depth).
FULL_DEPTH_GIB = 120


def gpu_memory_gib() -> float | None:
    """The first GPU's memory (nvidia-smi), or None where it cannot be asked."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return float(out.split()[0]) / 1024
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        return None


def fitted(args: list[str], memory_gib: float | None) -> list[str]:
    """A case's arguments for a GPU of this memory: the 32-layer fp16 hybrid cases at 16 layers below
    FULL_DEPTH_GIB."""
    fp16 = "--quantization" not in args
    if memory_gib is None or memory_gib >= FULL_DEPTH_GIB or not fp16 or "--layers" not in args:
        return args
    out = list(args)
    out[out.index("--layers") + 1] = "16"
    return out


def run_suite(bench: str, cases: list[str], log) -> tuple[dict[str, float], str]:
    """Runs the chosen cases; returns (figures, GPU name). A case that fails raises RuntimeError."""
    figures: dict[str, float] = {}
    gpu = ""
    memory = gpu_memory_gib()
    for case in SUITE:
        if case.name not in cases:
            continue
        t0 = time.perf_counter()
        args = fitted(case.args, memory)
        if args != case.args:
            print(f"({case.name}: 16 layers, to fit {memory:.0f} GiB)", file=sys.stderr, flush=True)
        proc = subprocess.run([bench, *args], capture_output=True, text=True, env={**os.environ, **case.env})
        log.write(f"$ {' '.join([bench, *args])}\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode != 0 or "JSON " not in proc.stdout:
            raise RuntimeError(f"case {case.name} failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
        report = json.loads(proc.stdout.split("JSON ", 1)[1].splitlines()[0])
        gpu = gpu or report.get("gpu", "")
        figures.update(figures_of(case.name, report))
        print(f"({case.name}: {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    if PEER.name in cases:
        out = Path(os.environ.get("TMPDIR", "/tmp")) / f"revolta-peer-{os.getpid()}.json"
        proc = subprocess.run([sys.executable, str(HERE / "torch_decode_peer.py"), *PEER.args, "--json", str(out)],
                              capture_output=True, text=True)
        log.write(f"$ torch_decode_peer.py {' '.join(PEER.args)}\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode != 0:
            raise RuntimeError(f"the torch peer failed: {proc.stderr.strip()[-400:]}")
        figures.update({f"{PEER.name} c{b}": tps for b, tps in json.loads(out.read_text()).items()})
        out.unlink()
    return figures, gpu


def derived(fig: dict[str, float]) -> list[tuple[str, float]]:
    """Ratios read beside the figures (not gated): engine / peer, speculation / plain decoding, and
    the prefill cost of a token at 8K over that at 1K."""
    rows = []
    for c in (1, 8, 32, 64):
        if f"llama-8b c{c}" in fig and f"torch-peer c{c}" in fig:
            rows.append((f"llama-8b / torch peer c{c}", fig[f"llama-8b c{c}"] / fig[f"torch-peer c{c}"]))
    for c in (1, 8):
        if f"qwen3-next-mtp4 c{c}" in fig and f"qwen3-next c{c}" in fig:
            rows.append((f"mtp4 / plain decoding c{c}", fig[f"qwen3-next-mtp4 c{c}"] / fig[f"qwen3-next c{c}"]))
    if "qwen3-next prefill 1K" in fig and "qwen3-next prefill 8K" in fig:
        rows.append(("qwen3-next prefill cost per token, 8K / 1K", fig["qwen3-next prefill 1K"] / fig["qwen3-next prefill 8K"]))
    return rows


def compare(measured: dict[str, float], baseline: dict[str, float], tolerance: float) -> tuple[list[str], list[str]]:
    """(table lines, failures): every figure against its baseline; higher is better for all of them.
    A baseline figure that was not measured fails too (a case that stopped running)."""
    lines = ["| figure (tok/s) | baseline | measured | change | |", "|---|---|---|---|---|"]
    failures = []
    for name in sorted(set(measured) | set(baseline)):
        base, now = baseline.get(name), measured.get(name)
        if now is None:
            failures.append(f"{name}: not measured (baseline {base:,.1f})")
            lines.append(f"| {name} | {base:,.1f} | - | - | MISSING |")
            continue
        if base is None:
            lines.append(f"| {name} | - | {now:,.1f} | - | new |")
            continue
        change = now / base - 1.0
        verdict = "ok"
        if change < -tolerance:
            verdict = "DROP"
            failures.append(f"{name}: {now:,.1f} against {base:,.1f} ({100 * change:+.1f}%)")
        lines.append(f"| {name} | {base:,.1f} | {now:,.1f} | {100 * change:+.1f}% | {verdict} |")
    return lines, failures


def baseline_path(gpu: str) -> Path:
    """benchmarks/baselines/<gpu name>.json ('NVIDIA H200 (compute capability 9.0)' -> nvidia-h200.json)."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.split(" (")[0].lower()).strip("-") or "unknown-gpu"
    return BASELINES / f"{slug}.json"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=HERE,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", help="revolta_bench (default: the installed package's)")
    ap.add_argument("--lane", default="native", help="the build lane whose baseline applies: native or sm70")
    ap.add_argument("--cases", default=",".join(CASES), help=f"a subset of {','.join(CASES)}")
    ap.add_argument("--tolerance", type=float, default=0.10, help="the largest drop that passes (0.10: 10%%)")
    ap.add_argument("--baseline", help="baseline file (default: benchmarks/baselines/<gpu>.json)")
    ap.add_argument("--results", help="write the measured figures here (JSON)")
    ap.add_argument("--compare", help="compare this results file instead of running the suite")
    ap.add_argument("--log", help="the benchmarks' full output (default: beside --results, or not kept)")
    ap.add_argument("--update-baseline", action="store_true",
                    help="write the measured figures as this GPU and lane's baseline (then commit it with the reason)")
    args = ap.parse_args(argv)

    if args.compare:
        results = json.loads(Path(args.compare).read_text())
        measured, gpu, lane = results["figures"], results["gpu"], results.get("lane", args.lane)
    else:
        cases = [c for c in args.cases.split(",") if c]
        unknown = sorted(set(cases) - set(CASES))
        if unknown:
            print(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})", file=sys.stderr)
            return 2
        bench = args.bench
        if not bench:
            import revolta

            bench = str(Path(revolta.__file__).parent / "bin" / "revolta_bench")
        log_path = args.log or (str(Path(args.results).with_suffix(".log")) if args.results else os.devnull)
        try:
            with open(log_path, "w") as log:
                measured, gpu = run_suite(bench, cases, log)
        except (RuntimeError, OSError) as e:
            print(f"perf gate: {e}", file=sys.stderr)
            return 2
        if not gpu:
            print("perf gate: revolta_bench named no GPU (a build without CUDA?)", file=sys.stderr)
            return 2
        lane = args.lane
        if args.results:
            Path(args.results).write_text(json.dumps({"gpu": gpu, "lane": lane, "commit": git_commit(),
                                                      "figures": measured}, indent=1) + "\n")

    path = Path(args.baseline) if args.baseline else baseline_path(gpu)
    stored = json.loads(path.read_text()) if path.is_file() else {"gpu": gpu, "lanes": {}}
    base = stored["lanes"].get(lane, {}).get("figures", {})
    if not args.compare and args.cases != ",".join(CASES):  # a subset: only its own figures are expected
        base = {k: v for k, v in base.items() if k in measured}
    print(f"performance gate: {gpu}, {lane} lane, baseline {path.name}"
          f" (measured at {stored['lanes'].get(lane, {}).get('commit', '-')}), tolerance {100 * args.tolerance:.0f}%")
    lines, failures = compare(measured, base, args.tolerance)
    print("\n".join(lines))
    for name, value in derived(measured):
        print(f"{name}: {value:.2f}")

    if args.update_baseline:
        stored["gpu"] = gpu
        merged = {**stored["lanes"].get(lane, {}).get("figures", {}), **{k: round(v, 1) for k, v in measured.items()}}
        stored["lanes"][lane] = {"commit": git_commit(), "figures": dict(sorted(merged.items()))}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=1) + "\n")
        print(f"baseline written to {path}: commit it with the reason in the message")
        return 0
    if not base:
        print(f"no baseline for {gpu} ({lane}) in {path}: run with --update-baseline to make one")
        return 1
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
