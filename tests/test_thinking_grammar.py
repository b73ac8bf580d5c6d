"""Grammars after the reasoning, on the real engine behind the real server (`--reasoning-parser
qwen3`): a tiny random Qwen3 model whose template opens `<think>` (as Qwen3.5's does) is made to
think a few tokens by a logit bias on `</think>`. With thinking on, the reasoning is the model's own
(random bytes, which no answer grammar here allows) and the answer is always held: a forced tool
call validates against its tool's schema, response_format and guided_regex answers match, streamed
and not, at temperature 1 over eight seeds each."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest

from conftest import QWEN_MARKERS, THINKING_CHATML, make_hf_model, with_qwen_markers
from server_fixture import qwen_parsers_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from qwen4exp_reference import write_tokenizer  # noqa: E402

VOCAB = 320
END_THINK = VOCAB - len(QWEN_MARKERS) + QWEN_MARKERS.index("</think>")
THINK_A_LITTLE = {"logit_bias": {str(END_THINK): 4.0}}  # about one token in seven ends the reasoning
SEEDS = range(8)
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
           "properties": {"city": {"enum": ["Oslo", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "additionalProperties": False, "required": ["zone"], "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}]
ASK = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]
ANSWER = {"type": "object", "additionalProperties": False, "required": ["ok", "n"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = tmp_path_factory.mktemp("thinking-model")
    markers = {m: VOCAB - len(QWEN_MARKERS) + i for i, m in enumerate(QWEN_MARKERS)}
    make_hf_model("qwen3", path, vocab_size=VOCAB, eos_token_id=markers["<|im_end|>"], max_position_embeddings=1024)
    write_tokenizer(path, VOCAB)
    with_qwen_markers(path, THINKING_CHATML)
    yield from qwen_parsers_client(path, "thinker", 32 << 20, "hermes")


def chat(client, stream: bool, seed: int, **kw) -> tuple[str, str, list[tuple[str, str]], str]:
    """(reasoning, content, [(name, arguments)], finish_reason) of one chat request."""
    body = dict(model="thinker", messages=ASK, temperature=1.0, seed=seed, max_tokens=200, extra_body=THINK_A_LITTLE)
    body.update(kw)
    if not stream:
        c = client.chat.completions.create(**body).choices[0]
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
        return getattr(c.message, "reasoning_content", None) or "", c.message.content or "", calls, c.finish_reason
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(stream=True, **body):
        d = chunk.choices[0].delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
        for t in d.tool_calls or []:
            name, args = calls.get(t.index, ("", ""))
            calls[t.index] = (name + (t.function.name or ""), args + (t.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    return reasoning, content, [calls[i] for i in sorted(calls)], finish


def thought_freely(reasonings: list[str]) -> None:
    """Most answers came after some reasoning, and what it holds is no answer the grammar allows
    (its first bytes are not the answer's)."""
    said = [r for r in reasonings if r.strip()]
    assert len(said) >= len(reasonings) // 2, reasonings
    assert any(not r.lstrip().startswith(("{", "<tool_call>")) for r in said), said


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_after_thinking(client, stream):
    reasonings = []
    for seed in SEEDS:
        choice = "required" if seed % 2 else {"type": "function", "function": {"name": "get_time"}}
        reasoning, content, calls, finish = chat(client, stream, seed, tools=TOOLS, tool_choice=choice,
                                                 parallel_tool_calls=False)
        assert finish == "tool_calls" and len(calls) == 1 and not content.strip(), (seed, reasoning, content, calls)
        name, args = calls[0]
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[name]
        assert choice == "required" or name == "get_time"
        jsonschema.validate(json.loads(args), schema)
        reasonings.append(reasoning)
    thought_freely(reasonings)


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_and_regex_after_thinking(client, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    reasonings = []
    for seed in SEEDS:
        reasoning, content, calls, finish = chat(client, stream, seed, response_format=fmt)
        assert finish == "stop" and not calls, (seed, reasoning, content)
        jsonschema.validate(json.loads(content), ANSWER)
        reasonings.append(reasoning)
        reasoning, content, _, finish = chat(client, stream, seed, extra_body={**THINK_A_LITTLE, "guided_regex": "[a-c]{2}-[0-9]"})
        assert finish == "stop" and re.fullmatch("[a-c]{2}-[0-9]", content), (seed, reasoning, content)
        reasonings.append(reasoning)
    thought_freely(reasonings)


def test_thinking_off_holds_the_whole_output(client):
    """enable_thinking false: the template closes the block, so the grammar holds from the first token
    and nothing is reasoning."""
    for seed in range(3):
        reasoning, content, _, finish = chat(client, False, seed, extra_body={
            **THINK_A_LITTLE, "guided_regex": "[a-c]{2}-[0-9]", "chat_template_kwargs": {"enable_thinking": False}})
        assert finish == "stop" and reasoning == "" and re.fullmatch("[a-c]{2}-[0-9]", content)
