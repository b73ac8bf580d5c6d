"""/v1/messages and /v1/messages/count_tokens: Anthropic's shapes over the chat pipeline."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi.responses import JSONResponse

from revolta.server.errors import APIError
from revolta.server.generation import Delta
from revolta.server.openai.protocol import ChatCompletionRequest, SamplingFields
from revolta.server.openai.serving import Choice, OpenAIServing
from revolta.server.parsers.reasoning import ReasoningRouter, prompt_opens_reasoning
from revolta.server.parsers.tools import assemble, make_tool_parser
from revolta.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from revolta.server.streaming import EventStream

# The text that opens a call in each tool-call format; appended to the prompt to force a call.
_FORCED_CALL = {
    "qwen3_coder": lambda name: "<tool_call>\n<function=" + (f"{name}>\n" if name else ""),
    "hermes": lambda name: '<tool_call>\n{"name": "' + (f'{name}", "arguments": ' if name else ""),
}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") in ("image", "document"):
            raise APIError(400, f"content blocks of type '{block['type']}' are not supported", param="messages")
    return "".join(parts)


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
    def __init__(self, chat: OpenAIServing):
        self.chat = chat

    def to_chat(self, req: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
        messages: list[dict[str, Any]] = []
        if req.system:
            messages.append({"role": "system", "content": _text_of(req.system)})
        for m in req.messages:
            if isinstance(m.content, str) or m.role == "system":
                messages.append({"role": m.role, "content": _text_of(m.content)})
                continue
            if m.role == "user":
                for block in m.content:
                    if block.get("type") == "tool_result":
                        messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                         "content": _text_of(block.get("content", ""))})
                text = _text_of([b for b in m.content if b.get("type") != "tool_result"])
                if text or not any(b.get("type") == "tool_result" for b in m.content):
                    messages.append({"role": "user", "content": text})
            else:
                msg: dict[str, Any] = {"role": "assistant", "content": _text_of(m.content)}
                thinking = "".join(b.get("thinking", "") for b in m.content if b.get("type") == "thinking")
                if thinking:
                    msg["reasoning_content"] = thinking
                calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))}}
                         for b in m.content if b.get("type") == "tool_use"]
                if calls:
                    msg["tool_calls"] = calls
                messages.append(msg)
        choice = req.tool_choice.type if req.tool_choice else "auto"
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema}}
                 for t in req.tools or []]
        thinking = bool(req.thinking and req.thinking.type in ("enabled", "adaptive"))
        return ChatCompletionRequest(
            model=req.model, messages=messages, tools=tools or None,
            tool_choice="none" if choice == "none" else "auto",
            chat_template_kwargs={"enable_thinking": thinking},
        )

    async def count_tokens(self, req: CountTokensRequest) -> JSONResponse:
        self.chat.check_model(req.model)
        _, prompt_ids, _, _ = self.chat.render_chat(self.to_chat(req))
        return JSONResponse({"input_tokens": len(prompt_ids)})

    async def messages(self, req: MessagesRequest):
        chat = self.chat
        model = chat.check_model(req.model)
        creq = self.to_chat(req)
        _, prompt_ids, tools, thinking = chat.render_chat(creq)
        forced = req.tool_choice.type if req.tool_choice and req.tool_choice.type in ("any", "tool") else None
        if forced and not tools:
            raise APIError(400, f"tool_choice '{forced}' needs tools", param="tool_choice")
        if forced and thinking:
            raise APIError(400, "thinking may not be enabled when tool_choice forces tool use", param="tool_choice")
        if forced == "tool" and req.tool_choice.name not in {t["function"]["name"] for t in tools}:
            raise APIError(400, f"tool_choice names an unknown tool '{req.tool_choice.name}'", param="tool_choice")
        prefix = _FORCED_CALL[chat.opts.tool_call_parser](req.tool_choice.name if forced == "tool" else None) if forced else ""
        if prefix:
            prompt_ids = prompt_ids + chat.tok.encode(prefix, add_special_tokens=False)
        fields = SamplingFields(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, stop=req.stop_sequences)
        params = chat.sampling(fields, len(prompt_ids), req.max_tokens, None)
        rt = chat.reasoning_tokens
        router = (lambda: ReasoningRouter(rt, prompt_opens_reasoning(prompt_ids, rt), enabled=thinking)) if rt else (lambda: None)
        parser = (lambda: make_tool_parser(chat.opts.tool_call_parser, tools)) if tools else (lambda: None)
        (c,) = chat.start(prompt_ids, params, 0, router, parser)
        first = Delta()
        if prefix:
            _, first.tool_calls = c.tool_parser.feed(prefix)
            c.tool_deltas.extend(first.tool_calls)
        single = bool(req.tool_choice and req.tool_choice.disable_parallel_tool_use) or forced is not None
        msg_id = "msg_" + uuid.uuid4().hex[:24]
        t0 = time.perf_counter()
        if not req.stream:
            await chat.run_all([c], t0, len(prompt_ids))
            content: list[dict[str, Any]] = []
            if c.gen.reasoning:
                content.append({"type": "thinking", "thinking": c.gen.reasoning, "signature": ""})
            if c.content:
                content.append({"type": "text", "text": c.content})
            calls = assemble(c.tool_deltas)[: 1 if single else None]
            for call in calls:
                content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": parse_partial_json(call.arguments)})
            reason, seq = self.stop_reason(c, bool(calls))
            return JSONResponse({
                "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": reason, "stop_sequence": seq,
                "usage": {"input_tokens": len(prompt_ids), "output_tokens": c.gen.num_tokens},
            })
        return EventStream(self.events(c, first, msg_id, model, len(prompt_ids), single, t0))

    @staticmethod
    def stop_reason(c: Choice, has_calls: bool) -> tuple[str, str | None]:
        if c.gen.finish_reason == "length":
            return "max_tokens", None
        if isinstance(c.gen.stop_reason, str):
            return "stop_sequence", c.gen.stop_reason
        return ("tool_use" if has_calls else "end_turn"), None

    async def events(self, c: Choice, first: Delta, msg_id: str, model: str, prompt_len: int, single: bool, t0: float) -> AsyncIterator[str]:
        def event(kind: str, body: dict) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **body}, ensure_ascii=False)}\n\n"

        state = {"index": -1, "type": None}
        calls_seen: set[int] = set()

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
                if state["type"] != "text":
                    out += open_block("text", {"type": "text", "text": ""})
                out.append(event("content_block_delta", {"index": state["index"], "delta": {"type": "text_delta", "text": d.content}}))
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
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": prompt_len, "output_tokens": 0}}})
            yield event("ping", {})
            for item in translate(first):
                yield item
            async for _, delta in self.chat.deltas([c], t0):
                if delta is None:
                    yield event("ping", {})
                    continue
                for item in translate(delta):
                    yield item
            self.chat.observe(prompt_len, [c])
            for item in close_block():
                yield item
            reason, seq = self.stop_reason(c, bool(calls_seen))
            yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": {"output_tokens": c.gen.num_tokens}})
            yield event("message_stop", {})
        except APIError as e:
            yield event("error", {"error": {"type": "api_error" if e.status >= 500 else "invalid_request_error", "message": e.message}})
        finally:
            self.chat.abort([c])
