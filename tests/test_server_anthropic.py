"""Anthropic Messages API on the real server (demo model), driven by the official anthropic SDK."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from server_fixture import ServerProcess

KEY = "anthropic-test-key"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    srv = ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--api-key", KEY, "--max-model-len", "512",
                        "--kv-cache-memory-bytes", str(64 << 20), "--tool-call-parser", "hermes", "--max-request-bytes", "200000")
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


MSG = [{"role": "user", "content": "What is the capital of France?"}]
T0 = {"temperature": 0}  # this SDK version passes sampling options only as extra body fields


def test_plain_message_and_count_tokens(client):
    r = client.messages.create(model="smol", max_tokens=32, messages=MSG, extra_body=T0)
    assert r.type == "message" and r.role == "assistant"
    assert r.content[0].type == "text" and "Paris" in r.content[0].text
    assert r.stop_reason == "end_turn" and r.stop_sequence is None
    n = client.messages.count_tokens(model="smol", messages=MSG)
    assert r.usage.input_tokens == n.input_tokens > 0
    assert r.usage.output_tokens > 0
    with pytest.raises(anthropic.BadRequestError, match="maximum context length"):  # as messages would answer
        client.messages.count_tokens(model="smol", messages=[{"role": "user", "content": "word " * 600}])


def test_streaming_event_sequence_matches_non_streaming(server, client):
    full = client.messages.create(model="smol", max_tokens=24, messages=MSG, extra_body=T0)
    events = list(client.messages.create(model="smol", max_tokens=24, messages=MSG, extra_body=T0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert kinds.index("content_block_start") < kinds.index("content_block_delta") < kinds.index("content_block_stop")
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == full.content[0].text
    assert events[-2].delta.stop_reason == full.stop_reason
    assert events[-2].usage.output_tokens == full.usage.output_tokens
    raw = httpx.post(server.url + "/v1/messages?beta=true", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                     json={"model": "smol", "max_tokens": 4, "messages": MSG, "stream": True}).text
    names = [line[len("event: "):] for line in raw.splitlines() if line.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"  # the SDK hides pings
    with client.messages.stream(model="smol", max_tokens=24, messages=MSG, extra_body=T0) as stream:
        assert stream.get_final_message().content[0].text == full.content[0].text


def test_system_forms_stop_sequences_and_max_tokens(client):
    a = client.messages.create(model="smol", max_tokens=16, system="You are terse.", messages=MSG, extra_body=T0)
    b = client.messages.create(model="smol", max_tokens=16, system=[{"type": "text", "text": "You are terse."}], messages=MSG, extra_body=T0)
    c = client.messages.create(model="smol", max_tokens=16, messages=[{"role": "system", "content": "You are terse."}, *MSG], extra_body=T0)
    assert a.content[0].text == b.content[0].text == c.content[0].text
    text = a.content[0].text
    word = text.split()[1]
    r = client.messages.create(model="smol", max_tokens=16, system="You are terse.", messages=MSG, extra_body=T0, stop_sequences=[word])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == word and word not in r.content[0].text
    r = client.messages.create(model="smol", max_tokens=2, messages=MSG, extra_body=T0)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2


def test_multi_turn_with_tool_use_and_thinking_history(client):
    tools = [{"name": "get_weather", "description": "Weather of a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call the tool.", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}]},
    ]
    r = client.messages.create(model="smol", max_tokens=16, messages=messages, tools=tools, extra_body=T0)
    assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    beta = client.beta.messages.create(model="smol", max_tokens=4, messages=MSG, extra_body=T0)  # ?beta=true
    assert beta.content[0].type == "text"


def test_error_types(server, client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="smol", max_tokens=8, messages=MSG, extra_body={"temperature": 1.5})
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="maximum context length"):
        client.messages.create(model="smol", max_tokens=8, messages=[{"role": "user", "content": "word " * 600}])
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=8, messages=MSG)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(model="smol", max_tokens=8, messages=MSG)
    assert e.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                   json={"model": "smol", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 300000}]})
    assert r.status_code == 413 and r.json() == {"type": "error", "error": {"type": "request_too_large", "message": r.json()["error"]["message"]}}
    assert client.messages.create(model="smol", max_tokens=2, messages=MSG).content  # still serving


def test_billing_header_block_leaves_the_prefix_cached(client):
    """Claude Code's first system block (x-anthropic-billing-header, a value per request) is dropped,
    so two requests that differ only there share their prefix."""
    text = "You are a careful assistant who answers questions about geography in one short sentence. " * 4
    usage = []
    for cch in ("eb6c6", "0aaa9"):
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch={cch};"},
                  {"type": "text", "text": text}]
        usage.append(client.messages.create(model="smol", max_tokens=1, system=system, messages=MSG, extra_body=T0).usage)
    n = client.messages.count_tokens(model="smol", system=text, messages=MSG).input_tokens
    assert usage[0].input_tokens + usage[0].cache_read_input_tokens == n
    assert usage[1].input_tokens + usage[1].cache_read_input_tokens == n and usage[1].cache_read_input_tokens >= 64


WEATHER = {"name": "get_weather", "description": "Weather forecast for a city", "input_schema": {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}}}
TIME = {"name": "get_time", "description": "Local time of a city", "input_schema": {
    "type": "object", "additionalProperties": False, "required": ["city"], "properties": {"city": {"type": "string", "maxLength": 24}}}}


def test_forced_tool_use_over_sixteen_samples(client):
    """tool_choice any and a named tool, sixteen sampled responses at temperature 1 (streamed and not):
    each one's tool_use blocks name an offered tool (the named one when named) and their inputs
    validate against its schema."""
    import jsonschema

    schemas = {t["name"]: t["input_schema"] for t in (WEATHER, TIME)}
    ask = [{"role": "user", "content": "What's the weather in Oslo for the next 3 days?"}]
    for i in range(8):
        for choice in ({"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "get_time"}):
            body = dict(model="smol", max_tokens=120, messages=ask, tools=[WEATHER, TIME], tool_choice=choice,
                        extra_body={"temperature": 1.0})
            if i % 2:
                with client.messages.stream(**body) as s:
                    r = s.get_final_message()
            else:
                r = client.messages.create(**body)
            uses = [b for b in r.content if b.type == "tool_use"]
            assert r.stop_reason == "tool_use" and uses, r
            assert not [b for b in r.content if b.type == "text" and b.text.strip()], r
            for b in uses:
                assert b.name == choice.get("name", b.name)
                jsonschema.validate(b.input, schemas[b.name])
