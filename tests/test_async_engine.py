"""The output pump between the engine thread and asyncio: whatever stops it, no request is left
waiting, and the server learns the engine is dead."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from revolta.server.async_engine import AsyncEngine, Failure


class FakeEngine:
    """Hands out ids; await_outputs raises `error` once `armed` is set."""

    def __init__(self, error: BaseException):
        self.model_info = SimpleNamespace(max_model_len=64, vocab_size=100)
        self.error = error
        self.armed = threading.Event()
        self.aborted: list[int] = []
        self.next_id = 0

    def add_request(self, prompt, params, tag=None, media=None):
        self.next_id += 1
        return self.next_id

    def abort(self, rid):
        self.aborted.append(rid)

    def await_outputs(self, timeout):
        if self.armed.wait(timeout):
            raise self.error
        return []

    def shutdown(self):
        pass


@pytest.mark.parametrize("error", [RuntimeError("engine stopped by a fatal error: boom"), KeyError("surprise"), ValueError("odd")])
def test_any_pump_failure_fails_every_waiting_request(error):
    fake = FakeEngine(error)
    engine = AsyncEngine(fake, max_num_seqs=4)

    async def scenario():
        queues = [engine.add_request([1, 2], None)[1] for _ in range(3)]
        fake.armed.set()
        return await asyncio.wait_for(asyncio.gather(*[q.get() for q in queues]), 5)

    outs = asyncio.run(scenario())
    assert all(isinstance(o, Failure) and o.status == 500 for o in outs)
    assert engine.dead and engine.num_live == 0 and sorted(fake.aborted) == [1, 2, 3]
    with pytest.raises(RuntimeError, match="engine is dead"):
        asyncio.run(_add(engine))


async def _add(engine):
    engine.add_request([1], None)


def test_fail_all_ends_live_requests_with_the_given_status():
    fake = FakeEngine(RuntimeError("unused"))
    engine = AsyncEngine(fake, max_num_seqs=4)

    async def scenario():
        _, q = engine.add_request([1], None)
        engine.fail_all(503, "the server is shutting down")
        return await asyncio.wait_for(q.get(), 5)

    out = asyncio.run(scenario())
    assert out == Failure(503, "the server is shutting down") and fake.aborted == [1] and not engine.dead
    engine._stop = True
