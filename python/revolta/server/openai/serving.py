"""/v1/chat/completions and /v1/completions over the async engine, and what the other APIs share:
model names, sampling fields, the chat prompt (rendered and tokenized off the event loop), jobs."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse

from revolta.config import ServerOptions
from revolta.models.tokenizer import ChatTemplateError, Tokenizer
from revolta.sampling_params import SamplingParams
from revolta.server.async_engine import AsyncEngine
from revolta.server.errors import APIError, sse_error
from revolta.server.job import Admission, Choice, Job
from revolta.server.metrics import Metrics
from revolta.server.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from revolta.server.parsers.reasoning import ReasoningRouter, prompt_opens_reasoning, qwen3_reasoning_tokens
from revolta.server.parsers.tools import ToolCallDelta, assemble, make_tool_parser
from revolta.server.streaming import EventStream

# Template variables the server sets itself; chat_template_kwargs may not override them.
_RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


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
        # Every token decodes to at most max_token_chars characters, so a text longer than this
        # holds more than max_model_len tokens (x2: normalizers that drop characters).
        self.max_prompt_chars = 2 * self.max_model_len * tokenizer.max_token_chars
        self.reasoning_tokens = qwen3_reasoning_tokens(tokenizer) if options.reasoning_parser == "qwen3" else None
        limit = options.max_waiting_requests
        self.admission = Admission(engine.max_num_seqs + limit if limit else None)

    # ---- shared -----------------------------------------------------------------------------

    def check_model(self, model: str | None) -> str:
        if model is None or model in self.served_names:
            return self.served_names[0]
        raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")

    async def run_job(self, raw: Request | None, slots: int, handler: Callable[[Job], Awaitable]):
        """Runs handler with a new job (admitted for `slots` engine requests). The job ends when
        the handler fails or completes a non-streaming response; a stream ends it as it closes."""
        job = Job(self, raw, slots)
        try:
            return await handler(job)
        except BaseException:
            job.close()
            raise

    def context_error(self, prompt_len: int, param: str = "messages") -> APIError:
        return APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has "
                             f"{prompt_len} tokens, which leaves no room for the completion.", param=param)

    async def encode(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        """Tokenizes in a worker thread (a long text would stall every stream on the event loop)."""
        if len(text) > self.max_prompt_chars:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has "
                                f"{len(text)} characters, more than that many tokens can hold.", param=param)
        return await asyncio.to_thread(self.tok.encode, text, add_special_tokens)

    def sampling(self, req: SamplingFields, prompt_len: int, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        if prompt_len >= self.max_model_len:
            raise self.context_error(prompt_len)
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
                max_tokens=max_tokens if max_tokens is not None else room,
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

    def finish_reason(self, c: Choice) -> str | None:
        r = c.gen.finish_reason
        if r == "stop" and c.tool_deltas:
            return "tool_calls"
        return r

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

    async def complete(self, job: Job, build) -> JSONResponse:
        """A non-streaming response: drives the job to its end, then builds the body."""
        try:
            await job.run()
            return JSONResponse(build())
        finally:
            job.close()

    # ---- chat -------------------------------------------------------------------------------

    def render_chat_text(self, req: ChatCompletionRequest) -> tuple[str, list[dict] | None, bool]:
        tool_choice = req.tool_choice
        if isinstance(tool_choice, dict) or tool_choice not in (None, "none", "auto"):
            raise APIError(400, f"tool_choice {json.dumps(tool_choice)} is not supported; use 'auto' or 'none'", param="tool_choice")
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        use_tools = bool(tools) and tool_choice != "none"
        if use_tools and not self.opts.tool_call_parser:
            raise APIError(400, "tools need a tool-call parser: start the server with --tool-call-parser", param="tools")
        messages = []
        for m in req.messages:
            d = m.model_dump(exclude_none=True)
            if isinstance(d.get("content"), list):
                parts = d["content"]
                if any(p.get("type") != "text" for p in parts):
                    raise APIError(400, "only text content parts are supported", param="messages")
                d["content"] = "".join(p.get("text") or "" for p in parts)
            for call in d.get("tool_calls") or []:
                fn = call["function"]
                if isinstance(fn["arguments"], str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
            messages.append(d)
        kwargs = dict(req.chat_template_kwargs or {})
        reserved = sorted(_RESERVED_TEMPLATE_VARS & set(kwargs))
        if reserved:
            raise APIError(400, f"chat_template_kwargs may not set {', '.join(reserved)} (the server sets them)", param="chat_template_kwargs")
        try:
            text = self.tok.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt, tools=tools if use_tools else None, **kwargs)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from e
        thinking = bool(kwargs.get("enable_thinking", True))
        return text, tools if use_tools else None, thinking

    async def render_chat(self, req: ChatCompletionRequest) -> tuple[str, list[int], list[dict] | None, bool]:
        """The prompt text and ids, the tools in use and whether thinking is on; templating and
        tokenizing run in a worker thread."""
        text, tools, thinking = await asyncio.to_thread(self.render_chat_text, req)
        return text, await self.encode(text, False, "messages"), tools, thinking

    async def chat(self, req: ChatCompletionRequest, raw: Request | None):
        model = self.check_model(req.model)
        return await self.run_job(raw, req.n, lambda job: self._chat(req, job, model))

    async def _chat(self, req: ChatCompletionRequest, job: Job, model: str):
        text, prompt_ids, tools, thinking = await self.render_chat(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        top = req.top_logprobs if req.logprobs else None
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
        params = self.sampling(req, len(prompt_ids), max_tokens, (top or 0) if req.logprobs else None)
        rt = self.reasoning_tokens
        router_factory = (lambda: ReasoningRouter(rt, prompt_opens_reasoning(prompt_ids, rt), enabled=thinking)) if rt else (lambda: None)
        tool_factory = (lambda: make_tool_parser(self.opts.tool_call_parser, tools)) if tools else (lambda: None)
        choices = job.start(prompt_ids, params, 0, 0, router_factory, tool_factory)
        rid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        single_call = not req.parallel_tool_calls

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
            def body() -> dict:
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
                return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                        "choices": result, "usage": job.usage()}

            return await self.complete(job, body)

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        chunk = functools.partial(sse_chunk, head, include_usage)

        async def events() -> AsyncIterator[str]:
            for c in choices:
                yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])
            try:
                async for c, delta in job.deltas():
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
            except APIError as e:
                yield sse_error(e)
                return
            if include_usage:
                yield chunk([], job.usage())
            yield "data: [DONE]\n\n"

        return EventStream(events(), on_close=job.close)

    # ---- completions ------------------------------------------------------------------------

    async def completion_prompts(self, req: CompletionRequest) -> list[tuple[str, list[int]]]:
        p = req.prompt
        if isinstance(p, str):
            return [(p, await self.encode(p, True, "prompt"))]
        if p and all(isinstance(x, int) for x in p):
            return [(await self.decode(p), list(p))]  # type: ignore[arg-type]
        out = []
        for x in p:  # type: ignore[union-attr]
            if isinstance(x, str):
                out.append((x, await self.encode(x, True, "prompt")))
            else:
                out.append((await self.decode(x), list(x)))
        if not out:
            raise APIError(400, "prompt must not be empty", param="prompt")
        return out

    async def decode(self, ids: list[int], param: str = "prompt") -> str:
        bad = [t for t in ids if t >= max(self.engine.model_info.vocab_size, self.tok.vocab_size)]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary", param=param)
        return await asyncio.to_thread(self.tok.decode, ids, False)

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

    async def completions(self, req: CompletionRequest, raw: Request | None):
        model = self.check_model(req.model)
        p = req.prompt
        num_prompts = 1 if isinstance(p, str) or (p and all(isinstance(x, int) for x in p)) else len(p)
        return await self.run_job(raw, max(1, num_prompts) * req.n, lambda job: self._completions(req, job, model))

    async def _completions(self, req: CompletionRequest, job: Job, model: str):
        prompts = await self.completion_prompts(req)
        for _, ids in prompts:
            if not ids:
                raise APIError(400, "prompt must contain at least one token", param="prompt")
        for k, (text, ids) in enumerate(prompts):
            params = self.sampling(req, len(ids), req.max_tokens if req.max_tokens is not None else 16, req.logprobs)
            job.start(ids, params, k * req.n, k, lambda: None, lambda: None)
        all_choices = job.choices
        rid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        echo = {c.index: prompts[c.prompt_no][0] if req.echo else "" for c in all_choices}

        if not req.stream:
            return await self.complete(job, lambda: {
                "id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{
                    "index": c.index, "text": echo[c.index] + c.content, "finish_reason": c.gen.finish_reason,
                    "stop_reason": c.gen.stop_reason,
                    "logprobs": self.completion_logprobs(c.all_tokens, len(echo[c.index])) if req.logprobs is not None else None,
                } for c in all_choices],
                "usage": job.usage(),
            })

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        chunk = functools.partial(sse_chunk, head, include_usage)

        async def events() -> AsyncIterator[str]:
            offsets = {c.index: len(echo[c.index]) for c in all_choices}
            for c in all_choices:
                if echo[c.index]:
                    yield chunk([{"index": c.index, "text": echo[c.index], "logprobs": None, "finish_reason": None}])
            try:
                async for c, delta in job.deltas():
                    if delta is None:
                        yield ": keep-alive\n\n"
                        continue
                    if not delta.content and not c.done and not (req.logprobs is not None and delta.tokens):
                        continue
                    lp = self.completion_logprobs(delta.tokens, offsets[c.index]) if req.logprobs is not None else None
                    offsets[c.index] += len(delta.content)
                    yield chunk([{"index": c.index, "text": delta.content, "logprobs": lp, "finish_reason": c.gen.finish_reason if c.done else None}])
            except APIError as e:
                yield sse_error(e)
                return
            if include_usage:
                yield chunk([], job.usage())
            yield "data: [DONE]\n\n"

        return EventStream(events(), on_close=job.close)
