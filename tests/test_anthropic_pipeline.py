"""The Messages API pipeline over a scripted engine: thinking and tool_use blocks, forced tool
choice, a tool call cut by max_tokens, an error inside a stream, and the 429 / 503 guards."""

from __future__ import annotations

import asyncio
import json

from fastapi.testclient import TestClient

from revolta.config import ServerOptions
from revolta.server.anthropic.protocol import MessagesRequest
from revolta.server.anthropic.serving import AnthropicServing, parse_partial_json
from revolta.server.app import create_app
from revolta.server.async_engine import Failure
from revolta.server.metrics import Metrics
from revolta.server.pipeline import Pipeline
from scripted_engine import ScriptedEngine

TOOLS = [{"name": "get_weather", "description": "weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}]


def serving(tok, text, parser="qwen3_coder"):
    eos = tok.token_to_id("<|im_end|>")
    engine = ScriptedEngine(tok.encode(text, add_special_tokens=False) + [eos], eos)
    opts = ServerOptions(reasoning_parser="qwen3", tool_call_parser=parser)
    return AnthropicServing(Pipeline(engine, tok, ["m"], opts, Metrics(engine))), engine


def run_both(svc, body):
    async def non_streaming():
        return json.loads((await svc.messages(MessagesRequest(**body))).body)

    async def streaming():
        r = await svc.messages(MessagesRequest(**body, stream=True))
        raw = "".join([c async for c in r.body_iterator])
        return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]

    return asyncio.run(non_streaming()), asyncio.run(streaming())


def merge(events):
    """Rebuilds the content blocks from stream events, as a client does."""
    blocks, stop = {}, None
    for e in events:
        if e["type"] == "content_block_start":
            blocks[e["index"]] = dict(e["content_block"], _json="")
        elif e["type"] == "content_block_delta":
            d, b = e["delta"], blocks[e["index"]]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "input_json_delta":
                b["_json"] += d["partial_json"]
        elif e["type"] == "message_delta":
            stop = e["delta"]["stop_reason"]
    out = []
    for i in sorted(blocks):
        b = blocks[i]
        if b["type"] == "tool_use":
            b["input"] = parse_partial_json(b["_json"])
        b.pop("_json")
        out.append(b)
    return out, stop


def strip(blocks):
    return [{k: v for k, v in b.items() if k not in ("id", "signature")} for b in blocks]


CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"


def test_thinking_text_and_tool_use_blocks(think_tokenizer):
    svc, _ = serving(think_tokenizer, "<think>Need the weather.</think>Let me check." + CALL)
    body = {"model": "m", "max_tokens": 400, "messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
            "thinking": {"type": "enabled", "budget_tokens": 100}}
    full, events = run_both(svc, body)
    assert [b["type"] for b in full["content"]] == ["thinking", "text", "tool_use"]
    assert full["content"][0]["thinking"] == "Need the weather." and full["content"][1]["text"] == "Let me check."
    assert full["content"][2]["name"] == "get_weather" and full["content"][2]["input"] == {"city": "Oslo", "days": 2}
    assert full["stop_reason"] == "tool_use"
    blocks, stop = merge(events)
    assert strip(blocks) == strip(full["content"]) and stop == "tool_use"
    assert [e["type"] for e in events][:2] == ["message_start", "ping"]


def test_forced_tool_is_reported_as_tool_use(think_tokenizer):
    # The request carries the grammar of calls to the named tool; the (scripted) model writes one.
    svc, engine = serving(think_tokenizer, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
                          parser="hermes")
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
            "tool_choice": {"type": "tool", "name": "get_weather"}}
    full, events = run_both(svc, body)
    assert full["stop_reason"] == "tool_use"
    assert [(b["type"], b.get("input")) for b in full["content"]] == [("tool_use", {"city": "Rome"})]
    assert engine.params[0].guided_kind == "lark" and '"const": "get_weather"' in engine.params[0].guided_data
    blocks, stop = merge(events)
    assert strip(blocks) == strip(full["content"]) and stop == "tool_use"


def test_whitespace_before_a_forced_call_is_no_text_block(think_tokenizer):
    """tool_choice any: the newline the model writes before its call is not a text block of its
    own, streaming or not; a whitespace answer without a call stays a text block both ways."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
            "tool_choice": {"type": "any"}}
    full, events = run_both(serving(think_tokenizer, "\n\n" + call, parser="hermes")[0], body)
    assert [b["type"] for b in full["content"]] == ["tool_use"] and full["stop_reason"] == "tool_use"
    blocks, stop = merge(events)
    assert strip(blocks) == strip(full["content"]) and stop == "tool_use"
    full, events = run_both(serving(think_tokenizer, "\n", parser="hermes")[0], {**body, "tool_choice": {"type": "auto"}})
    assert [(b["type"], b["text"]) for b in full["content"]] == [("text", "\n")]
    assert strip(merge(events)[0]) == strip(full["content"])


def test_tool_call_cut_by_max_tokens_same_both_ways(think_tokenizer):
    svc, _ = serving(think_tokenizer, CALL)
    n = len(think_tokenizer.encode(CALL[: CALL.index("</parameter>\n<parameter=days>")], add_special_tokens=False))
    body = {"model": "m", "max_tokens": n, "messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS}
    full, events = run_both(svc, body)
    assert full["stop_reason"] == "max_tokens"
    blocks, stop = merge(events)
    assert stop == "max_tokens" and strip(blocks) == strip(full["content"])
    assert full["content"][-1]["type"] == "tool_use" and full["content"][-1]["name"] == "get_weather"


def test_error_inside_a_stream_is_an_error_event(think_tokenizer):
    svc, engine = serving(think_tokenizer, "hello")
    original = engine.add_request

    def dying(prompt_ids, params, tag=None, media=None):
        rid, q = original(prompt_ids, params, tag)
        while not q.empty():
            q.get_nowait()
        q.put_nowait(Failure(500, "boom"))
        return rid, q

    engine.add_request = dying
    r = asyncio.run(_stream(svc))
    assert r[-1]["type"] == "error" and r[-1]["error"]["type"] == "api_error" and "boom" in r[-1]["error"]["message"]


async def _stream(svc):
    r = await svc.messages(MessagesRequest(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}], stream=True))
    raw = "".join([c async for c in r.body_iterator])
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]


def test_overload_and_dead_engine_statuses(think_tokenizer):
    eos = think_tokenizer.token_to_id("<|im_end|>")
    engine = ScriptedEngine([eos], eos)
    app = create_app(engine, think_tokenizer, ["m"], ServerOptions(max_waiting_requests=2))
    client = TestClient(app)
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    app.state.pipeline.admission.live = engine.max_num_seqs + 2  # every running and waiting place taken
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error" and r.headers["retry-after"] == "1"
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    app.state.pipeline.admission.live = 0
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert app.state.pipeline.admission.live == 0  # released when the request ended
    engine.dead = "fatal"
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
    assert client.get("/health").status_code == 503


def test_error_type_follows_the_status():
    from revolta.server.errors import json_error

    expected = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error"}
    for status, kind in expected.items():
        body = json.loads(json_error("/v1/messages", status, "m").body)
        assert body == {"type": "error", "error": {"type": kind, "message": "m"}}
        openai_body = json.loads(json_error("/v1/chat/completions", status, "m").body)
        assert openai_body["error"]["message"] == "m" and openai_body["error"]["code"] == status


def test_forced_tool_with_thinking_thinks_first(think_tokenizer):
    """Thinking on with tool_choice any: no 400; the call grammar reaches the engine gated on the end
    of the thinking, and the answer comes back as a thinking block and a tool_use block."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    svc, engine = serving(think_tokenizer, "<think>Rome, then.</think>" + call, parser="hermes")
    body = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
            "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    full, events = run_both(svc, body)
    assert [(b["type"], b.get("thinking"), b.get("input")) for b in full["content"]] == [
        ("thinking", "Rome, then.", None), ("tool_use", None, {"city": "Rome"})]
    assert full["stop_reason"] == "tool_use"
    p = engine.params[0]
    assert p.guided_kind == "lark" and p.reasoning_end_token == think_tokenizer.token_to_id("</think>")
    blocks, stop = merge(events)
    assert strip(blocks) == strip(full["content"]) and stop == "tool_use"
    run_both(svc, {**body, "thinking": {"type": "disabled"}})
    assert engine.params[-1].guided_kind == "lark" and engine.params[-1].reasoning_end_token == -1
