"""/v1/messages and /v1/messages/count_tokens: Anthropic's shapes over the shared pipeline (server/pipeline.py)."""

from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from revolta.guided import GuidedDecodingParams
from revolta.server.errors import APIError, anthropic_error_body
from revolta.server.generation import Delta
from revolta.server.requests import ChatCompletionRequest, SamplingFields
from revolta.server.job import Choice, Job
from revolta.server.pipeline import Pipeline, without_billing_header
from revolta.server.parsers.tool_grammar import tool_call_grammar
from revolta.server.parsers.tools import assemble
from revolta.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from revolta.server.streaming import EventStream


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") in ("image", "document"):
            raise APIError(400, f"content blocks of type '{block['type']}' are not supported here", param="messages")
    return "".join(parts)


def _content_of(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A user turn's blocks as chat content: the text, or with image blocks a list of parts (a
    base64 source as a data URL)."""
    if not any(b.get("type") == "image" for b in blocks):
        return _text_of(blocks)
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if block.get("type") != "image":
            parts.append({"type": "text", "text": _text_of([block])})
            continue
        src = block.get("source") or {}
        if src.get("type") == "base64" and isinstance(src.get("data"), str):
            url = f"data:{src.get('media_type') or 'image/png'};base64,{src['data']}"
        elif src.get("type") == "url" and isinstance(src.get("url"), str):
            url = src["url"]
        else:
            raise APIError(400, "an image block's source is {type: base64, media_type, data} or {type: url, url}",
                           param="messages")
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def parse_partial_json(text: str) -> dict:
    """A tool input cut short (max_tokens) still becomes an object: closed as far as it is valid."""
    for suffix in ("", "}", '"}', "]}", '"]}', "}}", '"}}'):
        try:
            value = json.loads(text + suffix)
            return value if isinstance(value, dict) else {}
        except ValueError:
            continue
    return {}


class AnthropicServing:
    def __init__(self, pipeline: Pipeline):
        self.p = pipeline

    def to_chat(self, req: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
        messages: list[dict[str, Any]] = []
        if req.system:  # (each block without Claude Code's billing line: pipeline.without_billing_header)
            if isinstance(req.system, str):
                system = without_billing_header(req.system)
            else:
                system = [{**b.model_dump(), "text": without_billing_header(b.text or "")} for b in req.system]
            messages.append({"role": "system", "content": _text_of(system)})
        for msg_in in req.messages:
            m = msg_in.model_dump()  # blocks as dicts; their fields were checked by the schema
            role, blocks = m["role"], m["content"]
            if isinstance(blocks, str) or role == "system":
                messages.append({"role": role, "content": _text_of(blocks)})
                continue
            if role == "user":
                for block in blocks:
                    if block.get("type") == "tool_result":
                        messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                         "content": _text_of(block.get("content", ""))})
                text = _content_of([b for b in blocks if b.get("type") != "tool_result"])
                if text or not any(b.get("type") == "tool_result" for b in blocks):
                    messages.append({"role": "user", "content": text})
            else:
                msg: dict[str, Any] = {"role": "assistant", "content": _text_of(blocks)}
                thinking = "".join(b["thinking"] for b in blocks if b.get("type") == "thinking")
                if thinking:
                    msg["reasoning_content"] = thinking
                calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))}}
                         for b in blocks if b.get("type") == "tool_use"]
                if calls:
                    msg["tool_calls"] = calls
                messages.append(msg)
        choice = req.tool_choice.type if req.tool_choice else "auto"
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema}}
                 for t in req.tools or []]
        thinking = bool(req.thinking and req.thinking.type in ("enabled", "adaptive"))
        # any / tool in Chat Completions' terms (they pick the call format: Pipeline.tool_format)
        forced = {"none": "none", "any": "required"}.get(choice, "auto")
        if choice == "tool" and req.tool_choice.name:
            forced = {"type": "function", "function": {"name": req.tool_choice.name}}
        return ChatCompletionRequest(
            model=req.model, messages=messages, tools=tools or None, tool_choice=forced,
            chat_template_kwargs={"enable_thinking": thinking},
        )

    async def count_tokens(self, req: CountTokensRequest) -> JSONResponse:
        self.p.check_model(req.model)
        prompt_ids = (await self.p.render_chat(self.to_chat(req))).ids  # media expanded: their tokens count
        if len(prompt_ids) >= self.p.max_model_len:  # as /v1/messages would answer it
            raise self.p.context_error(len(prompt_ids))
        return JSONResponse({"input_tokens": len(prompt_ids)})

    async def messages(self, req: MessagesRequest, raw: Request | None = None):
        model = self.p.check_model(req.model)
        return await self.p.run_job(raw, 1, lambda job: self._messages(req, job, model), req.priority)

    async def _messages(self, req: MessagesRequest, job: Job, model: str):
        p = self.p
        creq = self.to_chat(req)
        _, prompt_ids, tools, thinking, media = await p.render_chat(creq)
        forced = req.tool_choice.type if req.tool_choice and req.tool_choice.type in ("any", "tool") else None
        if forced and not tools:
            raise APIError(400, f"tool_choice '{forced}' needs tools", param="tool_choice")
        if forced == "tool" and req.tool_choice.name not in {t["function"]["name"] for t in tools}:
            raise APIError(400, f"tool_choice names an unknown tool '{req.tool_choice.name}'", param="tool_choice")
        fields = SamplingFields(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, stop=req.stop_sequences)
        params = p.sampling(fields, len(prompt_ids), req.max_tokens, None)
        single = bool(req.tool_choice and req.tool_choice.disable_parallel_tool_use)
        if forced:  # "any" / "tool": the output held to calls of the tools' schemas
            grammar = tool_call_grammar(p.tool_format(creq.tool_choice), tools,
                                        req.tool_choice.name if forced == "tool" else None, not single)
            params.guided_decoding = GuidedDecodingParams(grammar=grammar, field_name="tool_choice")
        p.grammar_after_reasoning(params, prompt_ids, thinking)
        (c,) = job.start(prompt_ids, params, 0, 0, *p.parsers(prompt_ids, tools, thinking, creq.tool_choice), media=media)
        first = Delta()
        msg_id = "msg_" + uuid.uuid4().hex[:24]

        def body() -> dict:
            content: list[dict[str, Any]] = []
            if c.gen.reasoning:
                content.append({"type": "thinking", "thinking": c.gen.reasoning, "signature": ""})
            calls = assemble(c.tool_deltas)[: 1 if single else None]
            if c.content and (c.content.strip() or not calls):  # (a forced call's leading newline is no text)
                content.append({"type": "text", "text": c.content})
            for call in calls:
                content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": parse_partial_json(call.arguments)})
            reason, seq = self.stop_reason(c, bool(calls))
            return {
                "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": reason, "stop_sequence": seq, "usage": {**self.usage(job), "output_tokens": c.gen.num_tokens},
            }

        if not req.stream:
            return await p.complete(job, body)
        return EventStream(self.events(job, first, msg_id, model, single), on_close=job.close)

    @staticmethod
    def usage(job: Job) -> dict:
        cached = job.cached_tokens()
        return {"input_tokens": job.prompt_len - cached, "cache_read_input_tokens": cached}

    @staticmethod
    def stop_reason(c: Choice, has_calls: bool) -> tuple[str, str | None]:
        if c.gen.finish_reason == "length":
            return "max_tokens", None
        if isinstance(c.gen.stop_reason, str):
            return "stop_sequence", c.gen.stop_reason
        return ("tool_use" if has_calls else "end_turn"), None

    async def events(self, job: Job, first: Delta, msg_id: str, model: str, single: bool) -> AsyncIterator[str]:
        (c,) = job.choices
        def event(kind: str, body: dict) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **body}, ensure_ascii=False)}\n\n"

        state = {"index": -1, "type": None}
        calls_seen: set[int] = set()
        held = [""]  # whitespace before any text block: text only if text or the end follows, not a call

        def open_block(kind: str, block: dict) -> list[str]:
            out = close_block()
            state["index"] += 1
            state["type"] = kind
            return out + [event("content_block_start", {"index": state["index"], "content_block": block})]

        def close_block() -> list[str]:
            if state["type"] is None:
                return []
            state["type"] = None
            return [event("content_block_stop", {"index": state["index"]})]

        def translate(d: Delta) -> list[str]:
            out: list[str] = []
            if d.reasoning:
                if state["type"] != "thinking":
                    out += open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                out.append(event("content_block_delta", {"index": state["index"], "delta": {"type": "thinking_delta", "thinking": d.reasoning}}))
            if d.content:
                if state["type"] != "text" and not (held[0] + d.content).strip():
                    held[0] += d.content
                else:
                    if state["type"] != "text":
                        out += open_block("text", {"type": "text", "text": ""})
                    text, held[0] = held[0] + d.content, ""
                    out.append(event("content_block_delta", {"index": state["index"], "delta": {"type": "text_delta", "text": text}}))
            if d.tool_calls:
                held[0] = ""
            for tc in d.tool_calls:
                if single and tc.index > 0:
                    continue
                if tc.index not in calls_seen:
                    calls_seen.add(tc.index)
                    out += open_block("tool_use", {"type": "tool_use", "id": tc.id, "name": tc.name, "input": {}})
                if tc.arguments:
                    out.append(event("content_block_delta", {"index": state["index"], "delta": {"type": "input_json_delta", "partial_json": tc.arguments}}))
            return out

        try:
            yield event("message_start", {"message": {
                "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": job.prompt_len, "output_tokens": 0}}})
            yield event("ping", {})
            for item in translate(first):
                yield item
            async for _, delta in job.deltas():
                if delta is None:
                    yield event("ping", {})
                    continue
                for item in translate(delta):
                    yield item
            if held[0] and not calls_seen:  # whitespace was all the answer: a text block, as without streaming
                for item in open_block("text", {"type": "text", "text": ""}):
                    yield item
                yield event("content_block_delta", {"index": state["index"], "delta": {"type": "text_delta", "text": held[0]}})
            for item in close_block():
                yield item
            reason, seq = self.stop_reason(c, bool(calls_seen))
            yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                          "usage": {**self.usage(job), "output_tokens": c.gen.num_tokens}})
            yield event("message_stop", {})
        except APIError as e:
            yield event("error", {"error": anthropic_error_body(e.status, e.message)["error"]})
