"""One HTTP request's engine work, from admission to release.

A Job holds admission slots for its engine requests (n x prompts) from the moment the request is
accepted, drives its choices, and ends exactly once: unfinished engine requests are aborted
(their KV blocks freed) and every choice is counted in /metrics by how it ended. It ends early
when the client goes (streaming or not), when the per-request deadline passes, or when the
server ends it (shutdown, engine failure).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Callable

from starlette.requests import Request

from revolta.sampling_params import SamplingParams
from revolta.server.async_engine import Failure
from revolta.server.errors import APIError
from revolta.server.generation import Delta, Generation, TokenInfo
from revolta.server.parsers.tools import ToolCallDelta, ToolParser

if TYPE_CHECKING:
    from revolta.server.pipeline import Pipeline


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
    it reaches the engine: up to max_num_seqs running plus max_waiting_requests waiting."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.live = 0

    def acquire(self, k: int) -> None:
        if self.limit is not None:
            if k > self.limit:
                raise APIError(400, f"this request needs {k} engine requests (n x prompts); the server admits at most {self.limit}", param="n")
            if self.live + k > self.limit:
                raise APIError(429, f"the server is at capacity ({self.live} of {self.limit} engine requests); retry later",
                               headers={"Retry-After": "1"})
        self.live += k

    def release(self, k: int) -> None:
        self.live -= k


class ClientGone(Exception):
    """The client of a non-streaming request disconnected; its work was aborted."""


async def _wait_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


class Job:
    def __init__(self, serving: "Pipeline", raw: Request | None, slots: int):
        serving.admission.acquire(slots)
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
              router_factory: Callable, tool_factory: Callable) -> list[Choice]:
        s = self.serving
        new: list[Choice] = []
        try:
            for i in range(params.n):
                rid, q = s.engine.add_request(prompt_ids, params.to_core(params.max_tokens or 1, seed_offset=i))
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
