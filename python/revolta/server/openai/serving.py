"""/v1/chat/completions and /v1/completions over the shared pipeline (server/pipeline.py)."""

from __future__ import annotations

import functools
import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from revolta import beam_search
from revolta.beam_search import BeamSearchParams
from revolta.server.errors import APIError, sse_error
from revolta.server.job import Choice, Job
from revolta.server.openai.protocol import CompletionRequest
from revolta.server.requests import ChatCompletionRequest
from revolta.server.parsers.tools import ToolCallDelta, assemble
from revolta.server.pipeline import Pipeline
from revolta.server.streaming import EventStream


def sse_chunk(head: dict, include_usage: bool, choices_json: list[dict], usage: dict | None = None) -> str:
    body = {**head, "choices": choices_json}
    if usage is not None or include_usage:
        body["usage"] = usage
    return "data: " + json.dumps(body, ensure_ascii=False) + "\n\n"


class OpenAIServing:
    """/v1/chat/completions and /v1/completions over the shared pipeline."""

    def __init__(self, pipeline: Pipeline):
        self.p = pipeline

    def finish_reason(self, c: Choice) -> str | None:
        r = c.gen.finish_reason
        if r == "stop" and c.tool_deltas:
            return "tool_calls"
        return r

    def chat_logprobs(self, tokens) -> list[dict]:
        out = []
        for ti in tokens:
            s = self.p.token_text(ti.token)
            out.append({
                "token": s, "logprob": ti.logprob, "bytes": list(s.encode()),
                "top_logprobs": [{"token": self.p.token_text(t), "logprob": lp, "bytes": list(self.p.token_text(t).encode())} for t, lp in ti.top],
            })
        return out

    # ---- chat -------------------------------------------------------------------------------

    async def chat(self, req: ChatCompletionRequest, raw: Request | None):
        model = self.p.check_model(req.model)
        return await self.p.run_job(raw, req.n, lambda job: self._chat(req, job, model), req.priority)

    async def _chat(self, req: ChatCompletionRequest, job: Job, model: str):
        if req.best_of is not None and req.best_of > req.n:
            raise APIError(400, "best_of greater than n is a /v1/completions option", param="best_of")
        text, prompt_ids, tools, thinking, media = await self.p.render_chat(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        top = req.top_logprobs if req.logprobs else None
        if req.top_logprobs and not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
        params = self.p.sampling(req, len(prompt_ids), max_tokens, (top or 0) if req.logprobs else None)
        self.p.force_tool_calls(req.tool_choice, req.parallel_tool_calls, tools, params)
        self.p.calls_or_answer(req.tool_choice, req.parallel_tool_calls, tools, params)
        self.p.grammar_after_reasoning(params, prompt_ids, thinking)
        choices = job.start(prompt_ids, params, 0, 0, *self.p.parsers(prompt_ids, tools, thinking, req.tool_choice), media=media)
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
                body = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                        "choices": result, "usage": job.usage()}
                if req.prompt_logprobs is not None:  # vLLM's: one list for the (shared) prompt
                    body["prompt_logprobs"] = self.p.prompt_logprobs(job.choices[0])
                return body

            return await self.p.complete(job, body)

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
            return [(p, await self.p.encode(p, True, "prompt"))]
        if p and all(isinstance(x, int) for x in p):
            return [(await self.p.decode(p), list(p))]  # type: ignore[arg-type]
        out = []
        for x in p:  # type: ignore[union-attr]
            if isinstance(x, str):
                out.append((x, await self.p.encode(x, True, "prompt")))
            else:
                out.append((await self.p.decode(x), list(x)))
        if not out:
            raise APIError(400, "prompt must not be empty", param="prompt")
        return out

    def completion_logprobs(self, tokens, offset: int) -> dict:
        toks, lps, tops, offs = [], [], [], []
        for ti in tokens:
            s = self.p.token_text(ti.token)
            toks.append(s)
            lps.append(ti.logprob)
            tops.append({self.p.token_text(t): lp for t, lp in ti.top})
            offs.append(offset)
            offset += len(s)
        return {"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs}

    async def _beam_search(self, req: CompletionRequest, job: Job, model: str):
        """use_beam_search: each prompt's n best beams (revolta/beam_search.py) as its choices."""
        for name, bad in (("stream", req.stream), ("logprobs", req.logprobs is not None), ("echo", req.echo),
                          ("temperature", req.temperature not in (None, 0)), ("stop", bool(req.stop)),
                          ("response_format", req.response_format is not None)):
            if bad:
                raise APIError(400, f"{name} is not supported with use_beam_search", param=name)
        prompts = await self.completion_prompts(req)
        limit = self.p.max_model_len
        max_tokens = req.max_tokens if req.max_tokens is not None else 16
        for _, ids in prompts:
            if not ids:
                raise APIError(400, "prompt must contain at least one token", param="prompt")
            if len(ids) + max_tokens > limit:
                raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                    f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the "
                                    "completion).", param="max_tokens")
        try:
            params = BeamSearchParams(beam_width=req.n, max_tokens=max_tokens, ignore_eos=req.ignore_eos,
                                      length_penalty=req.length_penalty)
        except ValueError as e:
            raise APIError(400, str(e), param="n" if "beam_width" in str(e) else None) from e
        eos = set(self.p.engine.model_info.eos_token_ids)
        try:
            results = await beam_search.run_async(self.p.engine, [ids for _, ids in prompts], params, eos)
        except RuntimeError as e:
            raise APIError(503, str(e)) from e
        finally:
            job.close()  # (its admission slots; the beams' engine requests have all ended)
        choices, completion = [], 0
        for k, ((_, ids), beams) in enumerate(zip(prompts, results)):
            for rank, b in enumerate(beams):
                gen = b.tokens[len(ids):]
                completion += len(gen)
                if b.finish_reason == "stop":
                    gen = gen[:-1]
                choices.append({"index": k * req.n + rank, "text": await self.p.decode(gen), "finish_reason": b.finish_reason,
                                "stop_reason": None, "logprobs": None, "cumulative_logprob": b.cum_logprob})
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        return JSONResponse({"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
                             "model": model, "choices": choices,
                             "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                       "total_tokens": prompt_tokens + completion}})

    def echoed_logprobs(self, tokens, prompt_tokens, prompt_ids: list[int], offset: int) -> dict:
        """Completions' logprobs of `tokens`; with an echo (offset > 0) the prompt's tokens come
        first, from prompt_tokens (prompt_logprobs), the first without a logprob."""
        out = self.completion_logprobs(tokens, offset)
        if prompt_tokens is None or offset == 0:
            return out
        first = self.p.token_text(prompt_ids[0])
        head = self.completion_logprobs(prompt_tokens, len(first))
        out["tokens"] = [first] + head["tokens"] + out["tokens"]
        out["token_logprobs"] = [None] + head["token_logprobs"] + out["token_logprobs"]
        out["top_logprobs"] = [None] + head["top_logprobs"] + out["top_logprobs"]
        out["text_offset"] = [0] + head["text_offset"] + out["text_offset"]
        return out

    async def completions(self, req: CompletionRequest, raw: Request | None):
        model = self.p.check_model(req.model)
        p = req.prompt
        num_prompts = 1 if isinstance(p, str) or (p and all(isinstance(x, int) for x in p)) else len(p)
        best_of = req.best_of or req.n
        if best_of > req.n and (req.stream or req.use_beam_search):
            raise APIError(400, "best_of greater than n cannot be streamed or beam searched", param="best_of")
        if req.use_beam_search:
            return await self.p.run_job(raw, max(1, num_prompts) * req.n, lambda job: self._beam_search(req, job, model),
                                        req.priority)
        return await self.p.run_job(raw, max(1, num_prompts) * best_of, lambda job: self._completions(req, job, model),
                                    req.priority)

    async def _completions(self, req: CompletionRequest, job: Job, model: str):
        prompts = await self.completion_prompts(req)
        for _, ids in prompts:
            if not ids:
                raise APIError(400, "prompt must contain at least one token", param="prompt")
        best_of = req.best_of or req.n
        for k, (text, ids) in enumerate(prompts):
            # echo with logprobs: the prompt's tokens carry theirs too; best_of ranks by the sampled
            # tokens' log-probabilities, so it asks for them
            params = self.p.sampling(req, len(ids), req.max_tokens if req.max_tokens is not None else 16,
                                     req.logprobs if req.logprobs is not None or best_of == req.n else 0,
                                     req.logprobs if req.echo and req.logprobs is not None else None)
            params.n = best_of
            job.start(ids, params, k * best_of, k, lambda: None, lambda: None)
        all_choices = job.choices
        rid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        echo = {c.index: prompts[c.prompt_no][0] if req.echo else "" for c in all_choices}

        def best(choices):
            """Each prompt's n best of its best_of choices (summed log-probability), renumbered."""
            if best_of == req.n:
                return choices
            out = []
            for k in range(len(prompts)):
                mine = sorted((c for c in choices if c.prompt_no == k), key=lambda c: -sum(t.logprob for t in c.all_tokens))
                for rank, c in enumerate(mine[:req.n]):
                    echo[k * req.n + rank] = echo[c.index]
                    c.index = k * req.n + rank
                    out.append(c)
            return out

        if not req.stream:
            return await self.p.complete(job, lambda: {
                "id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{
                    "index": c.index, "text": echo[c.index] + c.content, "finish_reason": c.gen.finish_reason,
                    "stop_reason": c.gen.stop_reason,
                    "logprobs": self.echoed_logprobs(c.all_tokens, c.prompt_tokens, prompts[c.prompt_no][1],
                                                     len(echo[c.index])) if req.logprobs is not None else None,
                    "prompt_logprobs": self.p.prompt_logprobs(c) if req.prompt_logprobs is not None else None,
                } for c in best(all_choices)],
                "usage": job.usage(),
            })

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        chunk = functools.partial(sse_chunk, head, include_usage)

        async def events() -> AsyncIterator[str]:
            offsets = {c.index: len(echo[c.index]) for c in all_choices}
            # With logprobs the echoed prompt waits for the first output, which brings its logprobs.
            echo_later = {c.index for c in all_choices if echo[c.index] and req.logprobs is not None}
            for c in all_choices:
                if echo[c.index] and c.index not in echo_later:
                    yield chunk([{"index": c.index, "text": echo[c.index], "logprobs": None, "finish_reason": None}])
            try:
                async for c, delta in job.deltas():
                    if delta is None:
                        yield ": keep-alive\n\n"
                        continue
                    if c.index in echo_later:
                        echo_later.discard(c.index)
                        head = self.echoed_logprobs([], c.prompt_tokens, prompts[c.prompt_no][1], len(echo[c.index]))
                        yield chunk([{"index": c.index, "text": echo[c.index], "logprobs": head, "finish_reason": None}])
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
