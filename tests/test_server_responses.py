"""OpenAI Responses API on the real server (demo model), driven by the official openai SDK."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from server_fixture import ServerProcess


@pytest.fixture(scope="module")
def client(demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--max-model-len", "512",
                        "--kv-cache-memory-bytes", str(64 << 20), "--tool-call-parser", "hermes")
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    log = srv.stop()
    assert "Traceback" not in log, log


def test_plain_and_streamed(client):
    kw = dict(model="smol", input="What is the capital of France?", max_output_tokens=64, temperature=0)
    r = client.responses.create(**kw)
    with_instructions = client.responses.create(instructions="You are a geography teacher.", **{**kw, "max_output_tokens": 4})
    root = str(client.base_url).rstrip("/").removesuffix("/v1")
    expected = httpx.post(root + "/tokenize", json={"messages": [
        {"role": "system", "content": "You are a geography teacher."}, {"role": "user", "content": kw["input"]}]}).json()["count"]
    assert with_instructions.usage.input_tokens == expected  # the instructions became the system turn
    assert r.status == "completed" and "Paris" in r.output_text
    assert r.output[-1].type == "message" and r.usage.output_tokens > 0 and r.usage.input_tokens > 0
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    for k in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
              "response.output_text.done", "response.content_part.done", "response.output_item.done"):
        assert k in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text
    with client.responses.stream(**kw) as stream:
        assert stream.get_final_response().output_text == r.output_text


def test_max_output_tokens_is_incomplete(client):
    """The response and the message item it cut short are incomplete, streamed or not."""
    kw = dict(model="smol", input="Tell me a story.", max_output_tokens=3, temperature=0)
    r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 3
    assert [(o.type, o.status) for o in r.output] == [("message", "incomplete")]
    events = list(client.responses.create(stream=True, **kw))
    done = [e.item.status for e in events if e.type == "response.output_item.done"]
    assert done == ["incomplete"] and events[-1].type == "response.incomplete"
    assert [o.status for o in events[-1].response.output] == ["incomplete"]


def test_function_call_output_round_trip_and_reasoning_items(client):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"},
    ]
    r = client.responses.create(model="smol", input=items, tools=tools, max_output_tokens=16, temperature=0)
    assert r.status in ("completed", "incomplete") and r.output


def test_errors(client):
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="smol", input="hi", previous_response_id="resp_123")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="other", input="hi")
    with pytest.raises(openai.BadRequestError, match="input: List should have at least 1 item"):
        client.responses.create(model="smol", input=[])  # (not an empty user turn)
    with pytest.raises(openai.BadRequestError, match="input.0: type 'web_search_call' is not one this server takes"):
        client.responses.create(model="smol", input=[{"type": "web_search_call", "id": "ws_1", "status": "completed"}])
    with pytest.raises(openai.BadRequestError, match="tools.0.type: 'web_search' tools are not run by this server"):
        client.responses.create(model="smol", input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="this model takes text only"):
        client.responses.create(model="smol", input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}])


def test_forced_tool_choice_is_enforced(client):
    """tool_choice "required" and the Responses API's own named form hold the output to calls."""
    tools = [{"type": "function", "name": name, "description": f"{name} of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
             for name in ("get_weather", "get_time")]
    for choice, names in (("required", {"get_weather", "get_time"}), ({"type": "function", "name": "get_time"}, {"get_time"})):
        r = client.responses.create(model="smol", input="Weather in Oslo?", tools=tools, tool_choice=choice,
                                    max_output_tokens=96, temperature=0, parallel_tool_calls=False)
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and len(calls) == 1 and calls[0].name in names
        assert isinstance(json.loads(calls[0].arguments)["city"], str)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.responses.create(model="smol", input="hi", tools=tools, tool_choice={"type": "allowed_tools"})
