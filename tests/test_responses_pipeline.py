"""The Responses pipeline over a scripted engine: reasoning items and function calls, streaming
events against the non-streaming response."""

from __future__ import annotations

import asyncio
import json

from revolta.config import ServerOptions
from revolta.server.metrics import Metrics
from revolta.server.openai.protocol import ResponsesRequest
from revolta.server.openai.responses import ResponsesServing
from revolta.server.pipeline import Pipeline
from scripted_engine import ScriptedEngine

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
TEXT = "<think>Weather needs the tool.</think>One moment.<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n</tool_call>"


def test_reasoning_and_function_call_items(think_tokenizer):
    eos = think_tokenizer.token_to_id("<|im_end|>")
    engine = ScriptedEngine(think_tokenizer.encode(TEXT, add_special_tokens=False) + [eos], eos)
    svc = ResponsesServing(Pipeline(engine, think_tokenizer, ["m"], ServerOptions(reasoning_parser="qwen3", tool_call_parser="qwen3_coder"),
                                         Metrics(engine)))
    body = {"model": "m", "input": "Weather in Lima?", "tools": TOOLS, "reasoning": {"effort": "medium"}}

    async def both():
        full = json.loads((await svc.create(ResponsesRequest(**body))).body)
        r = await svc.create(ResponsesRequest(**body, stream=True))
        raw = "".join([c async for c in r.body_iterator])
        return full, [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]

    full, events = asyncio.run(both())
    kinds = [o["type"] for o in full["output"]]
    assert kinds == ["reasoning", "message", "function_call"]
    assert full["output"][0]["content"][0]["text"] == "Weather needs the tool."
    assert full["output"][1]["content"][0]["text"] == "One moment."
    assert (full["output"][2]["name"], json.loads(full["output"][2]["arguments"])) == ("get_weather", {"city": "Lima"})
    assert full["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    final = events[-1]["response"]
    strip = lambda items: [{k: v for k, v in o.items() if k not in ("id", "call_id")} for o in items]  # noqa: E731
    assert events[-1]["type"] == "response.completed" and strip(final["output"]) == strip(full["output"])
    names = [e["type"] for e in events]
    i = names.index("response.function_call_arguments.delta")
    assert names[i - 1] == "response.output_item.added" and "response.function_call_arguments.done" in names[i:]
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Lima"}
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "Weather needs the tool."


def test_forced_call_and_text_format_start_after_the_reasoning(think_tokenizer):
    """With reasoning on, the forced-call grammar (tool_choice required) and text.format's schema
    reach the engine gated on </think> (the model may open <think> itself; <tool_call> also ends the
    reasoning); reasoning off ("minimal"), they hold from the first token."""
    eos = think_tokenizer.token_to_id("<|im_end|>")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
    engine = ScriptedEngine(think_tokenizer.encode("<think>Use the tool.</think>" + call, add_special_tokens=False) + [eos], eos)
    svc = ResponsesServing(Pipeline(engine, think_tokenizer, ["m"], ServerOptions(reasoning_parser="qwen3"), Metrics(engine)))
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}}
    bodies = [{"tools": TOOLS, "tool_choice": "required", "reasoning": {"effort": "medium"}},
              {"text": fmt, "reasoning": {"effort": "high"}}, {"tools": TOOLS, "tool_choice": "required", "reasoning": {"effort": "minimal"}}]
    outs = [json.loads(asyncio.run(svc.create(ResponsesRequest(model="m", input="Weather in Lima?", **b))).body) for b in bodies]
    tok = think_tokenizer.token_to_id
    for p in engine.params[:2]:
        assert p.guided_kind in ("lark", "json") and not p.in_reasoning
        assert (p.reasoning_start_token, p.reasoning_end_token, p.reasoning_answer_token) == (tok("<think>"), tok("</think>"), tok("<tool_call>"))
    assert engine.params[2].guided_kind == "lark" and engine.params[2].reasoning_end_token == -1
    assert [o["type"] for o in outs[0]["output"]] == ["reasoning", "function_call"]
    assert outs[0]["output"][0]["content"][0]["text"] == "Use the tool." and outs[0]["status"] == "completed"
