"""One HTTP request's engine work, from admission to release.

A Job holds admission slots for its engine requests (n x prompts) from the moment the request is
accepted, drives its choices, and ends exactly once: unfinished engine requests are aborted
(their KV blocks freed) and every choice is counted in /metrics by how it ended. It ends early
when the client goes (streaming or not), when the per-request deadline passes, or when the
server ends it (shutdown, engine failure).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterator

from starlette.requests import Request

from revolta import _core
from revolta.sampling_params import SamplingParams
from revolta.config import ServerOptions
from revolta.models.tokenizer import Tokenizer
from revolta.server.async_engine import AsyncEngine, Failure
from revolta.server.errors import APIError
from revolta.server.generation import Delta, Generation, TokenInfo
from revolta.server.guard import client_key
from revolta.server.metrics import Metrics
from revolta.server.parsers.tools import ToolCallDelta, ToolParser

log = logging.getLogger("revolta.server")


@dataclass
class Choice:
    """One of the n generations of one prompt."""

    index: int
    prompt_no: int
    rid: int
    queue: asyncio.Queue
    gen: Generation
    tool_parser: ToolParser | None = None
    tool_deltas: list[ToolCallDelta] = field(default_factory=list)
    content: str = ""  # content after tool-call extraction
    done: bool = False
    failure: str | None = None  # how /metrics counts a choice the engine or the server ended
    cached_tokens: int = 0
    all_tokens: list = field(default_factory=list)  # TokenInfo of every generated token
    prompt_tokens: list | None = None  # prompt_logprobs: TokenInfo of prompt tokens 1 .. n-1
    last_t: float | None = None  # when the previous token arrived (inter-token latency)


class Admission:
    """Counts engine requests from acceptance to release, so that a burst is judged before any of
    it reaches the engine: up to `capacity` at once (max_num_seqs running plus max_waiting_requests
    waiting) and `per_request` for one request; None: no limit. Each refusal is reported to
    on_reject with its reason, for /metrics."""

    _WINDOW_S = 30.0  # releases this recent give the drain rate behind Retry-After

    def __init__(self, capacity: int | None, per_request: int | None = None,
                 on_reject: Callable[[str], None] = lambda reason: None):
        self.capacity = capacity
        self.per_request = per_request
        self.on_reject = on_reject
        self.live = 0
        self._released: deque[tuple[float, int]] = deque()
        self._released_sum = 0

    def acquire(self, k: int) -> None:
        if self.per_request is not None and k > self.per_request:
            self.on_reject("request_too_large")
            raise APIError(400, f"this request needs {k} engine requests (n x prompts); one request may have at most "
                                f"{self.per_request} (max_seqs_per_request)", param="n")
        if self.capacity is not None and self.live + k > self.capacity:
            self.on_reject("queue_full")
            raise APIError(429, f"the server is at capacity ({self.live} of {self.capacity} engine requests); retry later",
                           headers={"Retry-After": str(self.retry_after(self.live + k - self.capacity))})
        self.live += k

    def release(self, k: int) -> None:
        self.live -= k
        now = time.monotonic()
        self._released.append((now, k))
        self._released_sum += k
        self._forget(now)

    def retry_after(self, short: int) -> int:
        """Seconds until `short` engine requests are likely to have ended, at the recent rate (1 to 60)."""
        now = time.monotonic()
        self._forget(now)
        if not self._released:
            return 1
        rate = self._released_sum / max(now - self._released[0][0], 1.0)
        return max(1, min(60, math.ceil(short / rate)))

    def _forget(self, now: float) -> None:
        while self._released and now - self._released[0][0] > self._WINDOW_S:
            self._released_sum -= self._released.popleft()[1]


# Deep enough for batch work (a few thousand prompts behind a small batch), finite so that a
# runaway client meets a 429 instead of a queue that outlives it.
WAITING_FLOOR, WAITING_PER_SLOT = 4096, 64


def admission_limits(max_num_seqs: int, kv_blocks: int, max_waiting: int | None,
                     per_request: int | None) -> tuple[int | None, int | None]:
    """(capacity, per-request limit) from the options; None picks the defaults: a queue of
    WAITING_PER_SLOT per sequence that can run at once (max_num_seqs, or the KV blocks if fewer:
    each needs one), at least WAITING_FLOOR, and half the capacity for one request, so that no
    request fills it alone. max_waiting 0: no queue limit."""
    if max_waiting is None:
        runnable = min(max_num_seqs, kv_blocks) if kv_blocks > 0 else max_num_seqs
        max_waiting = max(WAITING_FLOOR, WAITING_PER_SLOT * runnable)
    capacity = max_num_seqs + max_waiting if max_waiting else None
    if per_request is None and capacity is not None:
        per_request = max(1, capacity // 2)
    return capacity, per_request


def client_of(raw: Request | None) -> int:
    """Whom a request counts against for fair scheduling: its API key, hashed; 0: anonymous."""
    key = client_key(raw.headers.get("authorization"), raw.headers.get("x-api-key")) if raw is not None else None
    if not key:
        return 0
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") or 1


@dataclass
class JobContext:
    """What jobs share: the engine, the tokenizer, the server's options, its metrics, admission, and
    the numbering of jobs (each job's engine requests are one SchedulingTag group)."""

    engine: AsyncEngine
    tok: Tokenizer
    opts: ServerOptions
    metrics: Metrics
    admission: Admission
    groups: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    started: float | None = None  # time.monotonic() when revolta-server started (its first answer is logged)


class ClientGone(Exception):
    """The client of a non-streaming request disconnected; its work was aborted."""


async def _wait_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


class Job:
    def __init__(self, serving: JobContext, raw: Request | None, slots: int, priority: int = 0):
        serving.admission.acquire(slots)
        # Its engine requests are one group: the fair policy shares slots across groups and clients.
        self.tag = _core.SchedulingTag(priority=priority, group=next(serving.groups), client=client_of(raw))
        self.serving = serving
        self.raw = raw
        self.slots = slots
        self.choices: list[Choice] = []
        self.prompt_len = 0
        self.closed = False
        self.t0 = time.perf_counter()
        timeout = serving.opts.request_timeout_s
        self.deadline = self.t0 + timeout if timeout else None

    # ---- starting ---------------------------------------------------------------------------

    def start(self, prompt_ids: list[int], params: SamplingParams, index0: int, prompt_no: int,
              router_factory: Callable, tool_factory: Callable, media: list | None = None) -> list[Choice]:
        """media: the prompt's MediaInputs (multimodal prompts)."""
        s = self.serving
        new: list[Choice] = []
        try:
            for i in range(params.n):
                rid, q = s.engine.add_request(prompt_ids, params.to_core(params.max_tokens or 1, seed_offset=i), self.tag,
                                              media)
                gen = Generation(s.tok, params.stop, params.include_stop_str_in_output, params.skip_special_tokens, router_factory(),
                                 params.stop_token_ids)
                new.append(Choice(index=index0 + i, prompt_no=prompt_no, rid=rid, queue=q, gen=gen, tool_parser=tool_factory()))
        except ValueError as e:
            g = params.guided_decoding
            if g is not None and str(e).startswith("guided_decoding"):  # a grammar that does not compile
                raise APIError(400, g.field_name + str(e)[len("guided_decoding"):], param=g.field_name) from e
            raise APIError(400, str(e)) from e
        except RuntimeError as e:
            raise APIError(503 if s.engine.dead else 500, str(e)) from e
        finally:
            self.choices += new  # close() aborts them if the rest failed
        self.prompt_len += len(prompt_ids)
        return new

    # ---- driving ----------------------------------------------------------------------------

    async def next_delta(self, c: Choice) -> Delta:
        out = await c.queue.get()
        if isinstance(out, Failure):
            c.done, c.failure = True, out.reason
            raise APIError(out.status, out.message)
        c.cached_tokens = max(c.cached_tokens, out.num_cached_tokens)
        if out.prompt_logprobs:
            c.prompt_tokens = [TokenInfo(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                               for t in out.prompt_logprobs]
        if out.finished and out.finish_reason == "error":
            c.done, c.failure = True, "error"
            raise APIError(500, out.error or "the engine failed on this request")
        delta = c.gen.feed(out)
        if c.gen.stopped_by_string and not out.finished:
            self.serving.engine.abort(c.rid)  # its final (abort) output is drained below
        if out.finished:
            c.done = True
        elif c.gen.finish_reason is not None:
            while not out.finished:  # drain until the engine confirms the abort
                out = await c.queue.get()
                if isinstance(out, Failure):
                    break
            c.done = True
        if c.tool_parser is not None:
            text, calls = c.tool_parser.feed(delta.content)
            if c.done:
                rest, more = c.tool_parser.finish()
                text, calls = text + rest, calls + more
            delta.content = text
            c.tool_deltas.extend(calls)
            delta.tool_calls = calls
        c.content += delta.content
        return delta

    async def deltas(self) -> AsyncIterator[tuple[Choice, Delta | None]]:
        """Deltas of all choices as they come; (c, None) is a keep-alive tick. Raises APIError when
        the deadline passes or a choice fails."""
        metrics = self.serving.metrics
        keepalive = self.serving.opts.sse_keepalive_s
        pending = {asyncio.ensure_future(self.next_delta(c)): c for c in self.choices}
        try:
            while pending:
                timeout = keepalive
                if self.deadline is not None:
                    left = self.deadline - time.perf_counter()
                    if left <= 0:
                        raise APIError(504, f"the request ran longer than request_timeout_s ({self.serving.opts.request_timeout_s:g} s)")
                    timeout = left if timeout is None else min(timeout, left)
                done, _ = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    if keepalive is not None:
                        yield self.choices[0], None
                    continue
                for task in done:
                    c = pending.pop(task)
                    delta = task.result()
                    now = time.perf_counter()
                    if delta.tokens:
                        if c.last_t is None:
                            metrics.ttft.observe(now - self.t0)
                        else:
                            metrics.itl.observe((now - c.last_t) / len(delta.tokens))
                        c.last_t = now
                    c.all_tokens.extend(delta.tokens)
                    if not c.done:
                        pending[asyncio.ensure_future(self.next_delta(c))] = c
                    yield c, delta
        finally:
            for task in pending:
                task.cancel()

    async def run(self) -> None:
        """Drives a non-streaming request to its end; raises ClientGone if its client left first."""

        async def drain() -> None:
            async for _ in self.deltas():
                pass

        work = asyncio.ensure_future(drain())
        watchers = {work}
        if self.raw is not None:
            watchers.add(asyncio.ensure_future(_wait_disconnect(self.raw)))
        try:
            await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                raise ClientGone()
            work.result()
        finally:
            for t in watchers:
                t.cancel()

    # ---- ending -----------------------------------------------------------------------------

    def close(self) -> None:
        """Aborts what still runs, counts every choice by how it ended, frees the admission slots."""
        if self.closed:
            return
        self.closed = True
        s = self.serving
        s.admission.release(self.slots)
        if s.started is not None and any(c.done and not c.failure for c in self.choices):
            log.info("first answer %.1f s after revolta-server started", time.perf_counter() - s.started)
            s.started = None
        m = s.metrics
        m.prompt_tokens.inc(self.prompt_len)
        for c in self.choices:
            if not c.done:
                s.engine.abort(c.rid)
            reason = c.failure or (c.gen.finish_reason if c.done and c.gen.finish_reason else "abort")
            m.generation_tokens.inc(c.gen.num_tokens)
            m.requests.labels(finished_reason=reason).inc()

    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache, once per prompt."""
        best: dict[int, int] = {}
        for c in self.choices:
            best[c.prompt_no] = max(best.get(c.prompt_no, 0), c.cached_tokens)
        return sum(best.values())

    def usage(self) -> dict:
        completion = sum(c.gen.num_tokens for c in self.choices)
        return {
            "prompt_tokens": self.prompt_len,
            "completion_tokens": completion,
            "total_tokens": self.prompt_len + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens()},
        }
