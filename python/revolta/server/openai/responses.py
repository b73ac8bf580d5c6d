"""/v1/responses: OpenAI's Responses API (stateless: no stored responses) over the shared pipeline (server/pipeline.py)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request

from revolta.server.errors import APIError
from revolta.server.generation import Delta
from revolta.server.openai.protocol import ResponsesRequest
from revolta.server.requests import ChatCompletionRequest, SamplingFields
from revolta.server.job import Choice, Job
from revolta.server.pipeline import Pipeline
from revolta.server.parsers.tools import assemble
from revolta.server.streaming import EventStream


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    out = []
    for part in content or []:
        if part.get("type") in ("input_text", "output_text", "text"):
            out.append(part.get("text", ""))
        else:
            raise APIError(400, f"input content of type '{part.get('type')}' is not supported", param="input")
    return "".join(out)


def _content(content: Any) -> str | list[dict[str, Any]]:
    """A message's content as chat content: its text, or with input_image parts a list of parts."""
    if isinstance(content, str) or not any(p.get("type") == "input_image" for p in content or []):
        return _text(content)
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.get("type") == "input_image":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not url:
                raise APIError(400, "input_image: give image_url (a URL or a data URL); file_id is not supported "
                                    "(this server stores no files)", param="input")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": _text([part])})
    return parts


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ResponsesServing:
    def __init__(self, pipeline: Pipeline):
        self.p = pipeline

    def to_chat(self, req: ResponsesRequest) -> ChatCompletionRequest:
        if req.previous_response_id:
            raise APIError(400, "previous_response_id is not supported: this server stores no responses; send the items",
                           param="previous_response_id")
        messages: list[dict[str, Any]] = []
        if req.instructions:
            messages.append({"role": "system", "content": req.instructions})
        # Items as dicts; their fields were checked by the schema.
        items = [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else [i.model_dump() for i in req.input]
        pending_reasoning = ""
        for item in items:
            kind = item.get("type", "message")
            if kind == "message":
                role = "system" if item["role"] == "developer" else item["role"]
                msg = {"role": role, "content": _content(item["content"])}
                if role == "assistant" and pending_reasoning:
                    msg["reasoning_content"], pending_reasoning = pending_reasoning, ""
                messages.append(msg)
            elif kind == "function_call":
                call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
                if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                    messages[-1]["tool_calls"].append(call)
                else:
                    msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                    if pending_reasoning:
                        msg["reasoning_content"], pending_reasoning = pending_reasoning, ""
                    messages.append(msg)
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])})
            elif kind == "reasoning":
                pending_reasoning += "".join(part.get("text") or "" for part in (item.get("content") or []) + item["summary"])
            else:
                raise APIError(400, f"input items of type '{kind}' are not supported", param="input")
        tools = []
        for i, t in enumerate(req.tools or []):
            if t.type != "function":  # (web_search, file_search, ...: tools OpenAI's servers run themselves)
                raise APIError(400, f"tools.{i}.type: '{t.type}' tools are not run by this server; only function tools "
                                    "are supported", param=f"tools.{i}.type")
            if not t.name:
                raise APIError(400, f"tools.{i}.name: a function tool needs a name", param=f"tools.{i}.name")
            tools.append({"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.parameters or {}}})
        choice = req.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
            choice = {"type": "function", "function": {"name": choice["name"]}}  # Responses' named form, in chat's
        elif choice not in (None, "none", "auto", "required"):
            raise APIError(400, f"tool_choice {json.dumps(choice)} is not supported; use 'auto', 'none', 'required' or "
                                "{\"type\": \"function\", \"name\": ...}", param="tool_choice")
        if not messages:
            raise APIError(400, "input holds no message or function-call item to answer", param="input")
        effort = (req.reasoning or {}).get("effort")
        return ChatCompletionRequest(
            model=req.model, messages=messages, tools=tools or None, tool_choice=choice,
            chat_template_kwargs={"enable_thinking": effort not in ("none", "minimal")} if req.reasoning else None,
        )

    async def create(self, req: ResponsesRequest, raw: Request | None = None):
        model = self.p.check_model(req.model)
        return await self.p.run_job(raw, 1, lambda job: self._create(req, job, model), req.priority)

    async def _create(self, req: ResponsesRequest, job: Job, model: str):
        p = self.p
        creq = self.to_chat(req)
        _, prompt_ids, tools, thinking, media = await p.render_chat(creq)
        fields = SamplingFields(temperature=req.temperature, top_p=req.top_p, response_format=response_format(req.text))
        params = p.sampling(fields, len(prompt_ids), req.max_output_tokens, None)
        p.force_tool_calls(creq.tool_choice, req.parallel_tool_calls, tools, params)
        p.calls_or_answer(creq.tool_choice, req.parallel_tool_calls, tools, params)
        p.grammar_after_reasoning(params, prompt_ids, thinking)
        (c,) = job.start(prompt_ids, params, 0, 0, *p.parsers(prompt_ids, tools, thinking, creq.tool_choice), media=media)
        head = {"id": _new_id("resp"), "object": "response", "created_at": int(time.time()), "model": model,
                "parallel_tool_calls": req.parallel_tool_calls, "tool_choice": req.tool_choice or "auto",
                "tools": [t.model_dump(exclude_none=True) for t in req.tools or []], "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "temperature": req.temperature, "top_p": req.top_p}
        if not req.stream:
            return await p.complete(job, lambda: self.final(head, job, self.items(c, req.parallel_tool_calls)))
        return EventStream(self.events(head, job, req.parallel_tool_calls), on_close=job.close)

    def items(self, c: Choice, parallel: bool, ids: dict[str, str] | None = None) -> list[dict]:
        ids = ids or {}
        out: list[dict] = []
        if c.gen.reasoning:
            out.append({"type": "reasoning", "id": ids.get("reasoning") or _new_id("rs"), "summary": [],
                        "content": [{"type": "reasoning_text", "text": c.gen.reasoning}], "status": "completed"})
        if c.content:
            out.append({"type": "message", "id": ids.get("message") or _new_id("msg"), "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": c.content, "annotations": [], "logprobs": []}]})
        for call in assemble(c.tool_deltas)[: None if parallel else 1]:
            out.append({"type": "function_call", "id": ids.get(call.id) or _new_id("fc"), "call_id": call.id, "name": call.name,
                        "arguments": call.arguments, "status": "completed"})
        if out and c.gen.finish_reason == "length":  # the item max_output_tokens cut short
            out[-1]["status"] = "incomplete"
        return out

    def final(self, head: dict, job: Job, output: list[dict]) -> dict:
        (c,) = job.choices
        prompt_len = job.prompt_len
        incomplete = c.gen.finish_reason == "length"
        return {**head, "status": "incomplete" if incomplete else "completed", "output": output,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
                "usage": {"input_tokens": prompt_len, "output_tokens": c.gen.num_tokens, "total_tokens": prompt_len + c.gen.num_tokens,
                          "input_tokens_details": {"cached_tokens": job.cached_tokens()},
                          "output_tokens_details": {"reasoning_tokens": c.gen.num_reasoning_tokens}}}

    async def events(self, head: dict, job: Job, parallel: bool) -> AsyncIterator[str]:
        (c,) = job.choices
        seq = [0]

        def event(kind: str, body: dict) -> str:
            seq[0] += 1
            return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq[0] - 1, **body}, ensure_ascii=False)}\n\n"

        ids: dict[str, str] = {}
        open_item: dict[str, Any] = {"kind": None, "index": -1, "id": None, "text": "", "call": None}
        out_index = [-1]

        def close(status: str = "completed") -> list[str]:
            k, idx, iid = open_item["kind"], open_item["index"], open_item["id"]
            if k is None:
                return []
            open_item["kind"] = None
            if k == "reasoning":
                item = {"type": "reasoning", "id": iid, "summary": [], "content": [{"type": "reasoning_text", "text": open_item["text"]}], "status": status}
                return [event("response.reasoning_text.done", {"item_id": iid, "output_index": idx, "content_index": 0, "text": open_item["text"]}),
                        event("response.output_item.done", {"output_index": idx, "item": item})]
            if k == "message":
                part = {"type": "output_text", "text": open_item["text"], "annotations": [], "logprobs": []}
                item = {"type": "message", "id": iid, "role": "assistant", "status": status, "content": [part]}
                return [event("response.output_text.done", {"item_id": iid, "output_index": idx, "content_index": 0, "text": open_item["text"], "logprobs": []}),
                        event("response.content_part.done", {"item_id": iid, "output_index": idx, "content_index": 0, "part": part}),
                        event("response.output_item.done", {"output_index": idx, "item": item})]
            call = open_item["call"]
            item = {"type": "function_call", "id": iid, "call_id": call["call_id"], "name": call["name"], "arguments": open_item["text"], "status": status}
            return [event("response.function_call_arguments.done", {"item_id": iid, "output_index": idx, "arguments": open_item["text"], "name": call["name"]}),
                    event("response.output_item.done", {"output_index": idx, "item": item})]

        def start(kind: str, iid: str, item: dict, call: dict | None = None) -> list[str]:
            out = close()
            out_index[0] += 1
            open_item.update(kind=kind, index=out_index[0], id=iid, text="", call=call)
            out.append(event("response.output_item.added", {"output_index": out_index[0], "item": item}))
            if kind == "message":
                out.append(event("response.content_part.added", {"item_id": iid, "output_index": out_index[0], "content_index": 0,
                                                                 "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}))
            return out

        def translate(d: Delta) -> list[str]:
            out: list[str] = []
            if d.reasoning:
                if open_item["kind"] != "reasoning":
                    ids["reasoning"] = _new_id("rs")
                    out += start("reasoning", ids["reasoning"], {"type": "reasoning", "id": ids["reasoning"], "summary": [], "content": [], "status": "in_progress"})
                open_item["text"] += d.reasoning
                out.append(event("response.reasoning_text.delta", {"item_id": open_item["id"], "output_index": open_item["index"], "content_index": 0, "delta": d.reasoning}))
            if d.content:
                if open_item["kind"] != "message":
                    ids["message"] = _new_id("msg")
                    out += start("message", ids["message"], {"type": "message", "id": ids["message"], "role": "assistant", "status": "in_progress", "content": []})
                open_item["text"] += d.content
                out.append(event("response.output_text.delta", {"item_id": open_item["id"], "output_index": open_item["index"], "content_index": 0,
                                                                "delta": d.content, "logprobs": []}))
            for tc in d.tool_calls:
                if not parallel and tc.index > 0:
                    continue
                if tc.id:
                    ids[tc.id] = _new_id("fc")
                    call = {"call_id": tc.id, "name": tc.name}
                    out += start("call", ids[tc.id], {"type": "function_call", "id": ids[tc.id], "call_id": tc.id, "name": tc.name,
                                                      "arguments": "", "status": "in_progress"}, call)
                if tc.arguments:
                    open_item["text"] += tc.arguments
                    out.append(event("response.function_call_arguments.delta", {"item_id": open_item["id"], "output_index": open_item["index"], "delta": tc.arguments}))
            return out

        try:
            yield event("response.created", {"response": {**head, "status": "in_progress", "output": [], "usage": None}})
            yield event("response.in_progress", {"response": {**head, "status": "in_progress", "output": [], "usage": None}})
            async for _, delta in job.deltas():
                if delta is None:
                    yield ": keep-alive\n\n"
                    continue
                for item in translate(delta):
                    yield item
            for item in close("incomplete" if c.gen.finish_reason == "length" else "completed"):
                yield item
            final = self.final(head, job, self.items(c, parallel, ids))
            yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", {"response": final})
        except APIError as e:
            yield event("error", {"code": str(e.status), "message": e.message, "param": e.param})


def response_format(text: dict | None) -> dict | None:
    """The Responses API's text.format ({"type": "json_schema", "name", "schema", "strict"}) as Chat
    Completions' response_format."""
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema"),
                                                   "strict": fmt.get("strict")}}
