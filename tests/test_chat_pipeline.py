"""The chat endpoint's pipeline (template -> engine -> reasoning split -> tool parsing -> OpenAI
JSON) over a scripted engine: streaming and non-streaming must give the same message."""

from __future__ import annotations

import asyncio
import json

import pytest

from revolta.config import ServerOptions
from revolta.server.metrics import Metrics
from revolta.server.requests import ChatCompletionRequest
from revolta.server.openai.serving import OpenAIServing
from revolta.server.pipeline import Pipeline
from scripted_engine import ScriptedEngine

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]


def serve(tok, text: str, parser: str, **req):
    eos = tok.token_to_id("<|im_end|>")
    engine = ScriptedEngine(tok.encode(text, add_special_tokens=False) + [eos], eos)
    opts = ServerOptions(reasoning_parser="qwen3", tool_call_parser=parser)
    serving = OpenAIServing(Pipeline(engine, tok, ["m"], opts, Metrics(engine)))
    body = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "max_tokens": 500, **req}

    async def non_streaming():
        r = await serving.chat(ChatCompletionRequest(**body), None)
        return json.loads(r.body)

    async def streaming():
        r = await serving.chat(ChatCompletionRequest(**body, stream=True), None)
        chunks = [c async for c in r.body_iterator]
        return [json.loads(c[6:]) for c in "".join(chunks).split("\n\n") if c.startswith("data: {")]

    return asyncio.run(non_streaming()), asyncio.run(streaming()), engine


def merge_stream(chunks):
    content, reasoning, calls, finish = "", "", {}, None
    for ch in chunks:
        for c in ch["choices"]:
            d = c["delta"]
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                slot["name"] += tc["function"].get("name") or ""
                slot["arguments"] += tc["function"].get("arguments") or ""
            finish = c["finish_reason"] or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("parser,call_text", [
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'),
])
def test_reasoning_and_tool_call_streaming_matches_non_streaming(think_tokenizer, parser, call_text):
    text = "<think>The user wants weather. Use the tool.</think>Checking now." + call_text
    full, chunks, _ = serve(think_tokenizer, text, parser)
    msg = full["choices"][0]["message"]
    assert msg["reasoning_content"] == "The user wants weather. Use the tool."
    assert msg["content"] == "Checking now."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [("get_weather", {"city": "Oslo", "days": 2})]
    assert full["choices"][0]["finish_reason"] == "tool_calls"
    content, reasoning, calls, finish = merge_stream(chunks)
    assert (content, reasoning, finish) == ("Checking now.", msg["reasoning_content"], "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Oslo", "days": 2})]
    assert all(c["id"] for c in calls)


def test_parallel_tool_calls_false_keeps_the_first(think_tokenizer):
    one = '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>'
    two = '<tool_call>{"name": "get_weather", "arguments": {"city": "B"}}</tool_call>'
    full, chunks, _ = serve(think_tokenizer, one + two, "hermes", parallel_tool_calls=False)
    assert [json.loads(c["function"]["arguments"])["city"] for c in full["choices"][0]["message"]["tool_calls"]] == ["A"]
    assert [json.loads(c["arguments"])["city"] for c in merge_stream(chunks)[2]] == ["A"]
    for default in ({}, {"parallel_tool_calls": None}):  # null is the API's default, parallel calls
        full, _, _ = serve(think_tokenizer, one + two, "hermes", **default)
        assert len(full["choices"][0]["message"]["tool_calls"]) == 2


def test_tool_choice_none_and_thinking_off(think_tokenizer):
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    full, _, engine = serve(think_tokenizer, text, "hermes", tool_choice="none", chat_template_kwargs={"enable_thinking": False})
    msg = full["choices"][0]["message"]
    assert msg["content"] == text and "tool_calls" not in msg and "reasoning_content" not in msg
    prompt = think_tokenizer.decode(engine.prompts[0], skip_special_tokens=False)
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_assistant_tool_call_turn_with_null_content(demo_model_dir):
    """The OpenAI SDK sends an assistant tool-call turn as content: null; the demo model's template reads
    message.content, so the turn reaches it with empty content, and the tool result after it."""
    from revolta.models.tokenizer import Tokenizer

    tok = Tokenizer(demo_model_dir)
    messages = [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    full, chunks, engine = serve(tok, "It is sunny.", "hermes", messages=messages)
    assert full["choices"][0]["message"]["content"] == "It is sunny."
    assert merge_stream(chunks)[0] == "It is sunny."
    opts = ServerOptions(tool_call_parser="hermes")
    text, _, _ = Pipeline(engine, tok, ["m"], opts, Metrics(engine)).render_chat_text(ChatCompletionRequest(messages=messages))
    assert "sunny, 21 C" in text and "weather in Oslo?" in text


def test_tools_reach_a_template_that_drops_them(demo_model_dir):
    """The demo model's template ignores `tools`; the server then describes them in the system prompt
    in the parser's format, so the model can call them (and a system message keeps its text)."""
    from revolta.models.tokenizer import Tokenizer

    tok = Tokenizer(demo_model_dir)
    assert "get_weather" not in tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                                        tools=TOOLS)
    _, _, engine = serve(tok, "ok", "hermes")
    for parser, marker in (("hermes", '{"name": "function_name"'), ("qwen3_coder", "<function=function_name>")):
        p = Pipeline(engine, tok, ["m"], ServerOptions(tool_call_parser=parser), Metrics(engine))
        assert p.tools_in_prompt
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather?"}]
        text, tools, _ = p.render_chat_text(ChatCompletionRequest(messages=msgs, tools=TOOLS))
        assert tools and '"name": "get_weather"' in text and marker in text and "Be brief." in text
        plain, _, _ = p.render_chat_text(ChatCompletionRequest(messages=msgs))
        assert "get_weather" not in plain
