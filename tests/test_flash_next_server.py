"""Flash-Next behind the real server with the seed's parsers (`--reasoning-parser qwen3
--tool-call-parser qwen3_coder`), driven by the official openai SDK: a forced tool call comes out
as a qwen3_coder call whose arguments validate against the tool's schema (the grammar makes a
random model's output one), streamed and not, beside plain chat and completions.

The tiny reference model's byte-level tokenizer gets Qwen's ChatML and reasoning / tool markers in
place of four of its unused entries (ids below the model's vocabulary)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from conftest import with_qwen_markers
from server_fixture import qwen_parsers_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import qwen4exp_reference as ref  # noqa: E402

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = tmp_path_factory.mktemp("flash-next-server")
    ref.make_checkpoint("hc2-qsa4-ple", path)
    with_qwen_markers(path)
    yield from qwen_parsers_client(path, "flash", 64 << 20, "qwen3_coder")


def test_forced_tool_call_in_the_qwen3_coder_format(client):
    r = client.chat.completions.create(model="flash", messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0,
                                       seed=3, max_tokens=160, parallel_tool_calls=False, extra_body=NO_THINKING)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)

    parts = client.chat.completions.create(model="flash", messages=ASK, tools=TOOLS, stream=True, max_tokens=160,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           temperature=1.0, seed=4, parallel_tool_calls=False, extra_body=NO_THINKING)
    args, finish = "", None
    for chunk in parts:
        for d in chunk.choices[0].delta.tool_calls or []:
            args += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    jsonschema.validate(json.loads(args), WEATHER)


def test_plain_chat_and_completions(client):
    r = client.chat.completions.create(model="flash", messages=ASK, max_tokens=8, temperature=0.0, extra_body=NO_THINKING)
    assert r.usage.completion_tokens == 8 and isinstance(r.choices[0].message.content, str)
    c = client.completions.create(model="flash", prompt="Hello", max_tokens=5, temperature=0.0)
    assert c.usage.completion_tokens == 5 and c.choices[0].finish_reason == "length"
