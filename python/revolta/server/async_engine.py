"""asyncio front of the C++ engine: one pump thread moves engine outputs to per-request queues."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

from revolta import _core


@dataclass
class EngineDead:
    """Put on every queue when the engine thread died."""

    message: str


class AsyncEngine:
    def __init__(self, engine: _core.Engine):
        self.engine = engine
        self.model_info = engine.model_info
        self._queues: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._stop = False
        self.dead: str | None = None
        self._thread = threading.Thread(target=self._pump, name="revolta-pump", daemon=True)
        self._thread.start()

    def add_request(self, prompt_ids: list[int], params: _core.SamplingParams) -> tuple[int, asyncio.Queue]:
        """Raises ValueError for bad input (nothing is queued then)."""
        if self.dead:
            raise RuntimeError(f"engine is dead: {self.dead}")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        # Held across add_request so the pump cannot see an output before its queue exists.
        with self._lock:
            rid = self.engine.add_request(prompt_ids, params)
            self._queues[rid] = (loop, queue)
        return rid, queue

    def abort(self, rid: int) -> None:
        self.engine.abort(rid)

    def stats(self) -> Any:
        return self.engine.stats()

    def _pump(self) -> None:
        while not self._stop:
            try:
                outs = self.engine.await_outputs(0.1)
            except RuntimeError as e:  # fatal engine error
                self.dead = str(e)
                with self._lock:
                    queues, self._queues = list(self._queues.values()), {}
                for loop, q in queues:
                    loop.call_soon_threadsafe(q.put_nowait, EngineDead(str(e)))
                return
            if not outs:
                continue
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
                try:
                    loop.call_soon_threadsafe(q.put_nowait, o)
                except RuntimeError:  # the loop is closed
                    pass

    def shutdown(self) -> None:
        self._stop = True
        self.engine.shutdown()
        self._thread.join(timeout=5)
