"""asyncio front of the C++ engine: one pump thread moves engine outputs to per-request queues."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

from revolta import _core

log = logging.getLogger("revolta.server")


@dataclass
class Failure:
    """Put on a request's queue instead of an output: the engine died, or the server ends the request."""

    status: int
    message: str
    reason: str = "error"  # how /metrics counts the requests it ends


class AsyncEngine:
    def __init__(self, engine: _core.Engine, max_num_seqs: int, block_size: int = 16, scheduling_policy: str = "fair"):
        self.engine = engine
        self.model_info = engine.model_info
        self.max_num_seqs = max_num_seqs
        self.block_size = block_size
        self.scheduling_policy = scheduling_policy
        self._queues: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._stop = False
        self.dead: str | None = None
        self.stalled: str | None = None  # set by the watchdog while the engine runs no steps
        self._thread = threading.Thread(target=self._pump, name="revolta-pump", daemon=True)
        self._thread.start()

    def add_request(self, prompt_ids: list[int], params: _core.SamplingParams,
                    tag: _core.SchedulingTag | None = None, media: list | None = None) -> tuple[int, asyncio.Queue]:
        """Raises ValueError for bad input (nothing is queued then). media: MediaInputs."""
        if self.dead:
            raise RuntimeError(f"engine is dead: {self.dead}")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        # Held across add_request so the pump cannot see an output before its queue exists.
        with self._lock:
            rid = self.engine.add_request(prompt_ids, params, tag or _core.SchedulingTag(), media or [])
            self._queues[rid] = (loop, queue)
        return rid, queue

    def abort(self, rid: int) -> None:
        self.engine.abort(rid)

    def stats(self) -> Any:
        return self.engine.stats()

    @property
    def num_live(self) -> int:
        """Engine requests added through this front and not finished."""
        return len(self._queues)

    def fail_all(self, status: int, message: str, reason: str = "error") -> None:
        """Ends every live request with a Failure (and aborts it in the engine)."""
        with self._lock:
            entries, self._queues = list(self._queues.items()), {}
        for rid, (loop, q) in entries:
            self.engine.abort(rid)
            self._put(loop, q, Failure(status, message, reason))

    def _pump(self) -> None:
        try:
            while not self._stop:
                try:
                    outs = self.engine.await_outputs(0.1)
                except RuntimeError as e:  # the engine thread stopped on a fatal error
                    self._die(str(e))
                    return
                self._dispatch(outs)
        except Exception as e:  # noqa: BLE001 - a dead pump would leave every request hanging
            log.exception("the output pump failed")
            self._die(f"output pump failed: {e!r}")

    def _dispatch(self, outs: list) -> None:
        with self._lock:
            targets = []
            for o in outs:
                entry = self._queues.get(o.request_id)
                if entry is None:
                    continue
                if o.finished:
                    del self._queues[o.request_id]
                targets.append((entry, o))
        for (loop, q), o in targets:
            self._put(loop, q, o)

    def _die(self, message: str) -> None:
        self.dead = message
        self.fail_all(500, f"the engine failed: {message}")

    @staticmethod
    def _put(loop: asyncio.AbstractEventLoop, q: asyncio.Queue, item: Any) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # the loop is closed
            pass

    def shutdown(self) -> None:
        self._stop = True
        self.engine.shutdown()
        self._thread.join(timeout=5)
