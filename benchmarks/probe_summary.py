"""Summary of the decode kernels' phase timestamps that `revolta_bench --probe FILE` writes (a build
configured with -DREVOLTA_PROBE=ON; cuda/core/probe.cuh says what is marked).

    python benchmarks/probe_summary.py FILE [--launches 12] [--late]

Per kind of kernel: for each phase, the median over launches of its earliest, median and latest
block, in microseconds after the launch's first block started. Then one decode step launch by
launch: when its first block started, when its wait returned (first and last block), when its
last block left, and how long after the previous launch's last block its first wait returned.
With --late, per kind and phase: the blocks that were the latest most often, and the blocks
furthest behind their launch's median block (the median over launches of that gap).
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import Counter, defaultdict

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


def launches(visits) -> list[tuple[int, dict[int, dict[int, int]]]]:
    """Block visits grouped into launches ({block: marks}): by start time per kind, a new launch
    where a block repeats."""
    by_kind = defaultdict(list)
    for kind, block, marks in visits:
        by_kind[kind].append((marks[0], block, marks))
    out = []
    for kind, items in by_kind.items():
        items.sort()
        current: dict[int, dict[int, int]] = {}
        for _, block, marks in items:
            if block in current:
                out.append((kind, current))
                current = {}
            current[block] = marks
        if current:
            out.append((kind, current))
    out.sort(key=lambda kl: min(m[0] for m in kl[1].values()))
    return out


def late_blocks(ls, top: int = 6) -> None:
    """Per kind and phase: the blocks most often the latest of their launch, and those furthest
    behind their launch's median block (median over launches, in us)."""
    latest = defaultdict(Counter)
    behind = defaultdict(lambda: defaultdict(list))
    for kind, blocks in ls:
        for point in sorted({p for m in blocks.values() for p in m}):
            ts = [(m[point], b) for b, m in blocks.items() if point in m]
            med = statistics.median(t for t, _ in ts)
            latest[kind, point][max(ts)[1]] += 1
            for t, b in ts:
                behind[kind, point][b].append((t - med) / 1e3)
    for kind, point in sorted(latest):
        name, labels = POINTS.get(kind, (f"kind {kind}", {}))
        gaps = sorted(((statistics.median(v), b) for b, v in behind[kind, point].items()), reverse=True)[:top]
        print(f"{name} / {labels.get(point, f'point {point}')}: latest most often "
              + ", ".join(f"{b} ({n}x)" for b, n in latest[kind, point].most_common(top))
              + "; furthest behind the median " + ", ".join(f"{b} ({d:+.2f})" for d, b in gaps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--launches", type=int, default=12, help="launches listed in the step timeline")
    ap.add_argument("--late", action="store_true", help="which blocks are late at each phase")
    args = ap.parse_args()
    ls = launches(block_visits(args.file))
    if not ls:
        raise SystemExit("no records (a build without -DREVOLTA_PROBE=ON?)")
    per_kind = defaultdict(lambda: defaultdict(lambda: ([], [], [])))
    for kind, blocks in ls:
        t0 = min(m[0] for m in blocks.values())
        for point in sorted({p for m in blocks.values() for p in m}):
            ts = sorted((m[point] - t0) / 1e3 for m in blocks.values() if point in m)
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
    origin, prev_left = min(m[0] for m in ls[0][1].values()), None
    for kind, blocks in ls[: args.launches]:
        name = POINTS.get(kind, (f"kind {kind}", {}))[0]
        start = min(m[0] for m in blocks.values())
        waits = [m[1] for m in blocks.values() if 1 in m]
        left = max(m[EXIT] for m in blocks.values())
        hand = f"{(min(waits) - prev_left) / 1e3:9.2f}" if waits and prev_left else f"{'':9s}"
        w1 = f"{(min(waits) - origin) / 1e3:9.2f}" if waits else f"{'':9s}"
        w2 = f"{(max(waits) - origin) / 1e3:9.2f}" if waits else f"{'':9s}"
        print(f"  {name:20s} {(start - origin) / 1e3:8.2f} {w1} {w2} {(left - origin) / 1e3:8.2f} {hand}")
        prev_left = left
    if args.late:
        print()
        late_blocks(ls)


if __name__ == "__main__":
    main()
