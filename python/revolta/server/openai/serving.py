"""/v1/chat/completions and /v1/completions over the async engine."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from revolta.config import ServerOptions
from revolta.models.tokenizer import ChatTemplateError, Tokenizer
from revolta.sampling_params import SamplingParams
from revolta.server.async_engine import AsyncEngine, EngineDead
from revolta.server.errors import APIError
from revolta.server.generation import Delta, Generation
from revolta.server.metrics import Metrics
from revolta.server.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from revolta.server.parsers.reasoning import ReasoningRouter, prompt_opens_reasoning, qwen3_reasoning_tokens
from revolta.server.parsers.tools import ToolCallDelta, ToolParser, assemble, make_tool_parser
from revolta.server.streaming import EventStream


@dataclass
class Choice:
    """One of the n generations of one prompt."""

    index: int
    rid: int
    queue: asyncio.Queue
    gen: Generation
    tool_parser: ToolParser | None = None
    tool_deltas: list[ToolCallDelta] = field(default_factory=list)
    content: str = ""  # content after tool-call extraction
    done: bool = False
    all_tokens: list = field(default_factory=list)  # TokenInfo of every generated token
    last_t: float | None = None  # when the previous token arrived (inter-token latency)


def sse_chunk(head: dict, include_usage: bool, choices_json: list[dict], usage: dict | None = None) -> str:
    body = {**head, "choices": choices_json}
    if usage is not None or include_usage:
        body["usage"] = usage
    return "data: " + json.dumps(body, ensure_ascii=False) + "\n\n"


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, tokenizer: Tokenizer, served_names: list[str], options: ServerOptions, metrics: Metrics):
        self.engine = engine
        self.tok = tokenizer
        self.served_names = served_names
        self.opts = options
        self.metrics = metrics
        self.max_model_len = engine.model_info.max_model_len
        self.reasoning_tokens = qwen3_reasoning_tokens(tokenizer) if options.reasoning_parser == "qwen3" else None

    # ---- shared -----------------------------------------------------------------------------

    def check_model(self, model: str | None) -> str:
        if model is None or model in self.served_names:
            return self.served_names[0]
        raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")

    def sampling(self, req: SamplingFields, prompt_len: int, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        if prompt_len > self.max_model_len or (prompt_len == self.max_model_len and max_tokens):
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has {prompt_len} tokens.", param="messages")
        room = self.max_model_len - prompt_len
        if max_tokens is not None and max_tokens > room:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the completion).",
                param="max_tokens",
            )
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        try:
            return SamplingParams(
                n=req.n,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k or 0,
                min_p=req.min_p or 0.0,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                seed=req.seed,
                max_tokens=max_tokens if max_tokens is not None else max(1, room),
                min_tokens=min(req.min_tokens, max_tokens or room),
                stop=stop,
                stop_token_ids=list(req.stop_token_ids or []),
                include_stop_str_in_output=req.include_stop_str_in_output,
                ignore_eos=req.ignore_eos,
                logprobs=logprobs,
                skip_special_tokens=req.skip_special_tokens,
            )
        except ValueError as e:
            raise APIError(400, str(e)) from e

    def start(self, prompt_ids: list[int], params: SamplingParams, index0: int, router_factory, tool_factory) -> list[Choice]:
        choices = []
        try:
            for i in range(params.n):
                rid, q = self.engine.add_request(prompt_ids, params.to_core(params.max_tokens or 1, seed_offset=i))
                gen = Generation(self.tok, params.stop, params.include_stop_str_in_output, params.skip_special_tokens, router_factory())
                choices.append(Choice(index=index0 + i, rid=rid, queue=q, gen=gen, tool_parser=tool_factory()))
        except ValueError as e:
            self.abort(choices)
            raise APIError(400, str(e)) from e
        except RuntimeError as e:
            self.abort(choices)
            raise APIError(503 if self.engine.dead else 500, str(e)) from e
        return choices

    def abort(self, choices: list[Choice]) -> None:
        for c in choices:
            if not c.done:
                self.engine.abort(c.rid)

    async def next_delta(self, c: Choice) -> Delta:
        out = await c.queue.get()
        if isinstance(out, EngineDead):
            raise APIError(500, f"engine failed: {out.message}")
        delta = c.gen.feed(out)
        if c.gen.stopped_by_string and not out.finished:
            self.engine.abort(c.rid)  # its final (abort) output is drained below
        if out.finished:
            c.done = True
        elif c.gen.finish_reason is not None:
            while not out.finished:  # drain until the engine confirms the abort
                out = await c.queue.get()
                if isinstance(out, EngineDead):
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

    def observe(self, prompt_len: int, choices: list[Choice]) -> None:
        self.metrics.prompt_tokens.inc(prompt_len)
        for c in choices:
            self.metrics.generation_tokens.inc(c.gen.num_tokens)
            self.metrics.requests.labels(finished_reason=c.gen.finish_reason or "abort").inc()

    def finish_reason(self, c: Choice) -> str | None:
        r = c.gen.finish_reason
        if r == "stop" and c.tool_deltas:
            return "tool_calls"
        return r

    def usage(self, prompt_len: int, choices: list[Choice], cached: int = 0) -> dict:
        completion = sum(c.gen.num_tokens for c in choices)
        return {
            "prompt_tokens": prompt_len,
            "completion_tokens": completion,
            "total_tokens": prompt_len + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def token_text(self, t: int) -> str:
        return self.tok.decode([t], skip_special_tokens=False)

    def chat_logprobs(self, tokens) -> list[dict]:
        out = []
        for ti in tokens:
            s = self.token_text(ti.token)
            out.append({
                "token": s, "logprob": ti.logprob, "bytes": list(s.encode()),
                "top_logprobs": [{"token": self.token_text(t), "logprob": lp, "bytes": list(self.token_text(t).encode())} for t, lp in ti.top],
            })
        return out

    async def stream(self, gen: AsyncIterator[str], choices: list[Choice], raw: Request) -> EventStream:
        async def body() -> AsyncIterator[str]:
            try:
                async for item in gen:
                    yield item
            finally:
                # Client gone or error: free the blocks of whatever is still generating.
                for c in choices:
                    if not c.done:
                        self.metrics.requests.labels(finished_reason="abort").inc()
                self.abort(choices)

        return EventStream(body())

    # ---- chat -------------------------------------------------------------------------------

    def render_chat(self, req: ChatCompletionRequest) -> tuple[str, list[int], list[dict] | None, bool]:
        tool_choice = req.tool_choice
        if isinstance(tool_choice, dict) or tool_choice not in (None, "none", "auto"):
            raise APIError(400, f"tool_choice {json.dumps(tool_choice)} is not supported; use 'auto' or 'none'", param="tool_choice")
        use_tools = bool(req.tools) and tool_choice != "none"
        if use_tools and not self.opts.tool_call_parser:
            raise APIError(400, "tools need a tool-call parser: start the server with --tool-call-parser", param="tools")
        messages = []
        for m in req.messages:
            d = m.model_dump(exclude_none=True)
            if isinstance(d.get("content"), list):
                parts = d["content"]
                if any(p.get("type") not in ("text", None) for p in parts):
                    raise APIError(400, "only text content parts are supported", param="messages")
                d["content"] = "".join(p.get("text", "") for p in parts)
            for call in d.get("tool_calls") or []:
                fn = call.get("function", {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
            messages.append(d)
        kwargs = dict(req.chat_template_kwargs or {})
        try:
            text = self.tok.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt, tools=req.tools if use_tools else None, **kwargs)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from e
        thinking = bool(kwargs.get("enable_thinking", True))
        return text, self.tok.encode(text, add_special_tokens=False), req.tools if use_tools else None, thinking

    async def chat(self, req: ChatCompletionRequest, raw: Request):
        model = self.check_model(req.model)
        text, prompt_ids, tools, thinking = self.render_chat(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        top = req.top_logprobs if req.logprobs else None
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
        params = self.sampling(req, len(prompt_ids), max_tokens, (top or 0) if req.logprobs else None)
        rt = self.reasoning_tokens
        router_factory = (lambda: ReasoningRouter(rt, prompt_opens_reasoning(prompt_ids, rt), enabled=thinking)) if rt else (lambda: None)
        tool_factory = (lambda: make_tool_parser(self.opts.tool_call_parser, tools)) if tools else (lambda: None)
        choices = self.start(prompt_ids, params, 0, router_factory, tool_factory)
        rid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        single_call = not req.parallel_tool_calls
        t0 = time.perf_counter()

        def tool_calls_json(deltas: list[ToolCallDelta]) -> list[dict]:
            out = []
            for d in deltas:
                if single_call and d.index > 0:
                    continue
                item: dict[str, Any] = {"index": d.index, "function": {"arguments": d.arguments}}
                if d.id:
                    item["id"], item["type"] = d.id, "function"
                if d.name:
                    item["function"]["name"] = d.name
                out.append(item)
            return out

        if not req.stream:
            await self.run_all(choices, t0, len(prompt_ids))
            result = []
            for c in choices:
                msg: dict[str, Any] = {"role": "assistant", "content": c.content}
                if c.gen.reasoning:
                    msg["reasoning_content"] = c.gen.reasoning
                calls = assemble(c.tool_deltas)
                if single_call:
                    calls = calls[:1]
                if calls:
                    msg["tool_calls"] = [{"id": a.id, "type": "function", "function": {"name": a.name, "arguments": a.arguments}} for a in calls]
                    if not c.content.strip():
                        msg["content"] = None
                entry: dict[str, Any] = {"index": c.index, "message": msg, "finish_reason": self.finish_reason(c), "stop_reason": c.gen.stop_reason}
                entry["logprobs"] = {"content": self.chat_logprobs(c.all_tokens)} if req.logprobs else None
                result.append(entry)
            return JSONResponse({
                "id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": result, "usage": self.usage(len(prompt_ids), choices),
            })

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        chunk = functools.partial(sse_chunk, head, include_usage)

        async def events() -> AsyncIterator[str]:
            for c in choices:
                yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
            async for c, delta in self.deltas(choices, t0):
                if delta is None:
                    yield ": keep-alive\n\n"
                    continue
                d: dict[str, Any] = {}
                if delta.reasoning:
                    d["reasoning_content"] = delta.reasoning
                if delta.content:
                    d["content"] = delta.content
                calls = tool_calls_json(delta.tool_calls)
                if calls:
                    d["tool_calls"] = calls
                finished = c.done
                if not d and not finished and not (req.logprobs and delta.tokens):
                    continue
                entry: dict[str, Any] = {"index": c.index, "delta": d, "logprobs": None, "finish_reason": self.finish_reason(c) if finished else None}
                if req.logprobs and delta.tokens:
                    entry["logprobs"] = {"content": self.chat_logprobs(delta.tokens)}
                yield chunk([entry])
            self.observe(len(prompt_ids), choices)
            if include_usage:
                yield chunk([], self.usage(len(prompt_ids), choices))
            yield "data: [DONE]\n\n"

        return await self.stream(events(), choices, raw)

    # ---- driving ----------------------------------------------------------------------------

    async def run_all(self, choices: list[Choice], t0: float, prompt_len: int) -> None:
        """Drives a non-streaming request to the end (aborting everything on failure)."""
        try:
            async for _ in self.deltas(choices, t0):
                pass
        except BaseException:
            self.abort(choices)
            raise
        self.observe(prompt_len, choices)

    async def deltas(self, choices: list[Choice], t0: float) -> AsyncIterator[tuple[Choice, Delta | None]]:
        """Deltas of all choices as they come; (c, None) is a keep-alive tick."""
        pending = {asyncio.ensure_future(self.next_delta(c)): c for c in choices}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, timeout=self.opts.sse_keepalive_s, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    yield choices[0], None
                    continue
                for task in done:
                    c = pending.pop(task)
                    delta = task.result()
                    now = time.perf_counter()
                    if delta.tokens:
                        if c.last_t is None:
                            self.metrics.ttft.observe(now - t0)
                        else:
                            self.metrics.itl.observe((now - c.last_t) / len(delta.tokens))
                        c.last_t = now
                    c.all_tokens.extend(delta.tokens)
                    if not c.done:
                        pending[asyncio.ensure_future(self.next_delta(c))] = c
                    yield c, delta
        finally:
            for task in pending:
                task.cancel()

    # ---- completions ------------------------------------------------------------------------

    def completion_prompts(self, req: CompletionRequest) -> list[tuple[str, list[int]]]:
        p = req.prompt
        if isinstance(p, str):
            return [(p, self.tok.encode(p))]
        if p and all(isinstance(x, int) for x in p):
            return [(self.tok.decode(p), list(p))]  # type: ignore[arg-type]
        out = []
        for x in p:  # type: ignore[union-attr]
            if isinstance(x, str):
                out.append((x, self.tok.encode(x)))
            else:
                out.append((self.tok.decode(x), list(x)))
        if not out:
            raise APIError(400, "prompt must not be empty", param="prompt")
        return out

    def completion_logprobs(self, tokens, offset: int) -> dict:
        toks, lps, tops, offs = [], [], [], []
        for ti in tokens:
            s = self.token_text(ti.token)
            toks.append(s)
            lps.append(ti.logprob)
            tops.append({self.token_text(t): lp for t, lp in ti.top})
            offs.append(offset)
            offset += len(s)
        return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}

    async def completions(self, req: CompletionRequest, raw: Request):
        model = self.check_model(req.model)
        prompts = self.completion_prompts(req)
        for _, ids in prompts:
            if not ids:
                raise APIError(400, "prompt must contain at least one token", param="prompt")
        all_choices: list[Choice] = []
        prompt_len = 0
        try:
            for k, (text, ids) in enumerate(prompts):
                params = self.sampling(req, len(ids), req.max_tokens if req.max_tokens is not None else 16, req.logprobs)
                all_choices += self.start(ids, params, k * req.n, lambda: None, lambda: None)
                prompt_len += len(ids)
        except BaseException:
            self.abort(all_choices)
            raise
        rid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        t0 = time.perf_counter()
        echo = {c.index: prompts[c.index // req.n][0] if req.echo else "" for c in all_choices}

        if not req.stream:
            await self.run_all(all_choices, t0, prompt_len)
            return JSONResponse({
                "id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{
                    "index": c.index, "text": echo[c.index] + c.content, "finish_reason": c.gen.finish_reason,
                    "stop_reason": c.gen.stop_reason,
                    "logprobs": self.completion_logprobs(c.all_tokens, len(echo[c.index])) if req.logprobs is not None else None,
                } for c in all_choices],
                "usage": self.usage(prompt_len, all_choices),
            })

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        chunk = functools.partial(sse_chunk, head, include_usage)

        async def events() -> AsyncIterator[str]:
            offsets = {c.index: len(echo[c.index]) for c in all_choices}
            for c in all_choices:
                if echo[c.index]:
                    yield chunk([{"index": c.index, "text": echo[c.index], "logprobs": None, "finish_reason": None}])
            async for c, delta in self.deltas(all_choices, t0):
                if delta is None:
                    yield ": keep-alive\n\n"
                    continue
                if not delta.content and not c.done and not (req.logprobs is not None and delta.tokens):
                    continue
                lp = self.completion_logprobs(delta.tokens, offsets[c.index]) if req.logprobs is not None else None
                offsets[c.index] += len(delta.content)
                yield chunk([{"index": c.index, "text": delta.content, "logprobs": lp, "finish_reason": c.gen.finish_reason if c.done else None}])
            self.observe(prompt_len, all_choices)
            if include_usage:
                yield chunk([], self.usage(prompt_len, all_choices))
            yield "data: [DONE]\n\n"

        return await self.stream(events(), all_choices, raw)
