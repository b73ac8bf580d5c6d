"""The engine watchdog (--watchdog-config): a thread that checks every check_interval_s whether the
engine thread has moved on (Engine::activity: the step and its phase); after timeout_s in one
phase of one step (waiting idle does not count) it writes a dump
(what the engine thread is doing, its statistics, every Python thread's stack, and every native
thread's stack when gdb is installed) to dump_dir, logs it, and turns /health unhealthy until
it moves again. A paused or sleeping engine (/sleep) waits idle: it is not stalled."""

from __future__ import annotations

import faulthandler
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from revolta.json_options import json_object

log = logging.getLogger("revolta.server")

FIELDS = {"timeout_s": 300.0, "check_interval_s": 10.0, "dump_dir": None}


def parse_watchdog(value: Any) -> dict[str, Any] | None:
    """The option's value checked: a dict (or JSON text) of timeout_s, check_interval_s, dump_dir."""
    value = json_object(value, "watchdog_config", FIELDS)
    if value is None:
        return None
    out = {**FIELDS, **value}
    for key in ("timeout_s", "check_interval_s"):
        if not isinstance(out[key], (int, float)) or out[key] <= 0:
            raise ValueError(f"watchdog_config: {key} must be a positive number of seconds, got {out[key]!r}")
    if out["dump_dir"] is not None and not isinstance(out["dump_dir"], str):
        raise ValueError("watchdog_config: dump_dir must be a directory path")
    return out


class Watchdog:
    def __init__(self, engine, cfg: dict[str, Any]):
        self.engine = engine  # AsyncEngine: .engine is the core engine; .stalled is what /health reads
        self.timeout_s = float(cfg["timeout_s"])
        self.interval_s = float(cfg["check_interval_s"])
        self.dump_dir = Path(cfg["dump_dir"] or tempfile.gettempdir())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="revolta-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        core = self.engine.engine
        last, since = "", time.monotonic()
        while not self._stop.wait(self.interval_s):
            activity = core.activity()  # "step N: phase (k requests)": any progress changes it
            now = time.monotonic()
            if activity != last or ": idle " in activity or ": asleep " in activity:
                if self.engine.stalled:
                    log.warning("watchdog: the engine runs steps again (%s)", activity)
                    self.engine.stalled = None
                last, since = activity, now
                continue
            if now - since >= self.timeout_s and not self.engine.stalled:
                s = core.stats()
                path = self.dump(s)
                self.engine.stalled = f"no progress for {now - since:.0f} s in {activity}; dump: {path}"
                log.error("watchdog: %s", self.engine.stalled)

    def dump(self, stats) -> Path:
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        path = self.dump_dir / f"revolta-stall-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
        with open(path, "w") as f:
            f.write(f"engine thread: {self.engine.engine.activity()}\n")
            f.write(f"steps {stats.num_steps}, running {stats.num_running}, waiting {stats.num_waiting}, "
                    f"KV blocks used {stats.num_blocks_used} of {stats.num_blocks_total}\n\n")
            f.write("Python threads:\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.write("\nNative threads (C++ engine, ranks, pools):\n")
            f.write(native_stacks())
        return path


def native_stacks() -> str:
    gdb = shutil.which("gdb")
    if not gdb:
        return "(gdb is not installed: no native stacks)\n"
    try:
        r = subprocess.run([gdb, "-batch", "-nx", "-p", str(os.getpid()), "-ex", "thread apply all bt"],
                           capture_output=True, text=True, timeout=60)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(gdb failed: {e})\n"
