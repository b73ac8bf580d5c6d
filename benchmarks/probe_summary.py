"""Summary of the decode kernels' phase timestamps that `revolta_bench --probe FILE` writes (a build
configured with -DREVOLTA_PROBE=ON; cuda/core/probe.cuh says what is marked).

    python benchmarks/probe_summary.py FILE [--launches 12]

Per kind of kernel: for each phase, the median over launches of its earliest, median and latest
block, in microseconds after the launch's first block started. Then one decode step launch by
launch: when its first block started, when its wait returned (first and last block), when its
last block left, and how long after the previous launch's last block its first wait returned.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict

EXIT = 11  # cuda/core/probe.cuh: kProbePoints - 1, the block's exit
POINTS = {
    1: ("gdn_decode", {0: "start", 1: "wait returned", 2: "own rows projected", 3: "group ready",
                       4: "recurrence done", 5: "arrived", 6: "group's norm begun", EXIT: "left"}),
    2: ("moe_route_experts", {0: "start", 1: "wait returned", 2: "logits out, arrived", 3: "barrier passed",
                              4: "experts ranked", 5: "gate/up done", 6: "down rows done", 8: "ticket taken",
                              9: "summer's wait passed", 10: "column sums done", EXIT: "left"}),
    3: ("gemv_row", {0: "start", 1: "wait returned", 2: "x staged", EXIT: "left"}),
    4: ("decode_attention", {0: "start", 1: "wait returned", 2: "query ready", 3: "rounds done", 4: "split written",
                             EXIT: "left"}),
    5: ("qkv_rope_cache", {0: "start", 1: "wait returned", EXIT: "left"}),
}


def block_visits(path: str) -> list[tuple[int, int, dict[int, int]]]:
    """(kind, block, {point: ns}) per block of each launch: a block's records are consecutive."""
    visits: list[tuple[int, int, dict[int, int]]] = []
    with open(path) as f:
        for row in csv.DictReader(f):
            kind, point, block, t = (int(row[k]) for k in ("kind", "point", "block", "time_ns"))
            if point == 0 or not visits or visits[-1][0] != kind or visits[-1][1] != block:
                visits.append((kind, block, {}))
            visits[-1][2][point] = t
    return [v for v in visits if 0 in v[2] and EXIT in v[2]]  # a block cut off by a full log has no exit


def launches(visits) -> list[tuple[int, list[dict[int, int]]]]:
    """Block visits grouped into launches: by start time per kind, a new launch where a block repeats."""
    by_kind = defaultdict(list)
    for kind, block, marks in visits:
        by_kind[kind].append((marks[0], block, marks))
    out = []
    for kind, items in by_kind.items():
        items.sort()
        seen: set[int] = set()
        current: list[dict[int, int]] = []
        for _, block, marks in items:
            if block in seen:
                out.append((kind, current))
                seen, current = set(), []
            seen.add(block)
            current.append(marks)
        if current:
            out.append((kind, current))
    out.sort(key=lambda kl: min(m[0] for m in kl[1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--launches", type=int, default=12, help="launches listed in the step timeline")
    args = ap.parse_args()
    ls = launches(block_visits(args.file))
    if not ls:
        raise SystemExit("no records (a build without -DREVOLTA_PROBE=ON?)")
    per_kind = defaultdict(lambda: defaultdict(lambda: ([], [], [])))
    for kind, blocks in ls:
        t0 = min(m[0] for m in blocks)
        for point in sorted({p for m in blocks for p in m}):
            ts = sorted((m[point] - t0) / 1e3 for m in blocks if point in m)
            lo, med, hi = per_kind[kind][point]
            lo.append(ts[0]), med.append(statistics.median(ts)), hi.append(ts[-1])
    for kind, points in sorted(per_kind.items()):
        name, labels = POINTS.get(kind, (f"kind {kind}", {}))
        n = sum(1 for k, _ in ls if k == kind)
        print(f"{name}: {n} launches; us after the launch's first block started (median over launches)")
        print(f"  {'phase':24s} {'first':>8s} {'median':>8s} {'last':>8s}")
        for point, (lo, med, hi) in sorted(points.items()):
            label = labels.get(point, f"point {point}")
            print(f"  {label:24s} {statistics.median(lo):8.2f} {statistics.median(med):8.2f} {statistics.median(hi):8.2f}")
    print(f"\nfirst {args.launches} launches, us from the first one's start:")
    print(f"  {'kernel':20s} {'start':>8s} {'wait 1st':>9s} {'wait last':>9s} {'left':>8s} {'hand-off':>9s}")
    origin, prev_left = min(m[0] for m in ls[0][1]), None
    for kind, blocks in ls[: args.launches]:
        name = POINTS.get(kind, (f"kind {kind}", {}))[0]
        start = min(m[0] for m in blocks)
        waits = [m[1] for m in blocks if 1 in m]
        left = max(m[EXIT] for m in blocks)
        hand = f"{(min(waits) - prev_left) / 1e3:9.2f}" if waits and prev_left else f"{'':9s}"
        w1 = f"{(min(waits) - origin) / 1e3:9.2f}" if waits else f"{'':9s}"
        w2 = f"{(max(waits) - origin) / 1e3:9.2f}" if waits else f"{'':9s}"
        print(f"  {name:20s} {(start - origin) / 1e3:8.2f} {w1} {w2} {(left - origin) / 1e3:8.2f} {hand}")
        prev_left = left


if __name__ == "__main__":
    main()
