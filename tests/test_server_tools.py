"""Forced tool calls on the real server (demo model, official openai SDK): tool_choice "required" and
a named function constrain the output to calls in the active tool-call format whose arguments
validate against the tool's schema (jsonschema), at temperature 1, streamed and not;
parallel_tool_calls=false gives exactly one call."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from server_fixture import ServerProcess

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Current time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What's the weather in Oslo for the next 3 days?"}]


@pytest.fixture(scope="module", params=["hermes", "qwen3_coder"])
def server(request, demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--max-model-len", "1024",
                        "--kv-cache-memory-bytes", str(64 << 20), "--tool-call-parser", request.param)
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def check(calls, names):
    assert calls
    for c in calls:
        assert c.function.name in names
        try:
            args = json.loads(c.function.arguments)
        except ValueError as e:
            raise AssertionError(f"{c.function.name}: {c.function.arguments!r}") from e
        jsonschema.validate(args, SCHEMAS[c.function.name])


def test_required_and_named_calls_validate(client):
    for seed in range(2):
        r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=1.0, seed=seed, max_tokens=120, parallel_tool_calls=False)
        assert r.choices[0].finish_reason == "tool_calls"
        check(r.choices[0].message.tool_calls, SCHEMAS)
        assert len(r.choices[0].message.tool_calls) == 1
        named = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, temperature=1.0, seed=seed,
                                               max_tokens=120, tool_choice={"type": "function", "function": {"name": "get_time"}},
                                               parallel_tool_calls=False)
        check(named.choices[0].message.tool_calls, {"get_time"})
    # Parallel calls allowed: every call the model finished validates (it may go on calling until max_tokens).
    r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0,
                                       seed=3, max_tokens=120)
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason in ("tool_calls", "length")
    finished = calls if r.choices[0].finish_reason == "tool_calls" else calls[:-1]
    if finished:
        check(finished, SCHEMAS)


def test_forced_call_streams(client):
    stream = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="required", stream=True,
                                            temperature=1.0, seed=7, max_tokens=120, parallel_tool_calls=False)
    name, args, finish = "", "", None
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                name += tc.function.name or ""
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and name in SCHEMAS
    jsonschema.validate(json.loads(args), SCHEMAS[name])


def test_forced_call_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, max_tokens=8,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", messages=ASK, max_tokens=8, tool_choice="required")
    assert e.value.body["param"] == "tool_choice"


def test_anthropic_any_and_tool_give_valid_tool_use(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        m = client.messages.create(model="smol", max_tokens=120, messages=ASK, tools=tools,
                                   tool_choice={**choice, "disable_parallel_tool_use": True})
        assert m.stop_reason == "tool_use"
        (use,) = [b for b in m.content if b.type == "tool_use"]
        assert choice["type"] == "any" or use.name == "get_weather"
        jsonschema.validate(use.input, SCHEMAS[use.name])


ANSWER = {"type": "object", "additionalProperties": False, "required": ["summary"],
          "properties": {"summary": {"type": "string", "maxLength": 60}}}


def test_auto_with_a_json_answer_allows_calls_or_the_answer(client):
    """tools + response_format + tool_choice auto: the grammar is the union, so each sampled response
    (temperature 1, 8 seeds) is either valid calls or the answer valid against its schema; calls
    occur (the answer's grammar alone ruled them out). Which kind the demo model starts is its own
    choice: with hermes's format both occur, with qwen3_coder's calls only."""
    kinds = set()
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    for seed in range(8):
        r = client.chat.completions.create(model="smol", messages=ASK, tools=TOOLS, tool_choice="auto", response_format=fmt,
                                           temperature=1.0, seed=seed, max_tokens=120, parallel_tool_calls=False)
        c = r.choices[0]
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls"
            check(c.message.tool_calls, SCHEMAS)
            kinds.add("call")
        else:
            assert c.finish_reason == "stop", c
            jsonschema.validate(json.loads(c.message.content), ANSWER)
            kinds.add("answer")
    assert "call" in kinds, kinds
