"""Reasoning and tool-call parsers, replayed over scripted streams split at every chunk boundary."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from revolta.server.generation import Generation
from revolta.server.parsers.reasoning import ReasoningRouter, prompt_opens_reasoning, qwen3_reasoning_tokens
from revolta.server.parsers.tools import assemble, make_tool_parser

WEATHER_TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "threshold": {"type": "number"}, "tags": {"type": "array"},
        }},
    },
}]


def run_split(parser_name: str, text: str, cuts: list[int], tools=WEATHER_TOOLS):
    p = make_tool_parser(parser_name, tools)
    content, deltas, prev = "", [], 0
    for cut in [*cuts, len(text)]:
        c, d = p.feed(text[prev:cut])
        content += c
        deltas += d
        prev = cut
    c, d = p.finish()
    return content + c, deltas + d


def all_splits(parser_name: str, text: str):
    """The whole text at once, then every single cut point, then one character at a time."""
    yield run_split(parser_name, text, [])
    for i in range(1, len(text)):
        yield run_split(parser_name, text, [i])
    yield run_split(parser_name, text, list(range(1, len(text))))


QWEN3_CODER_TEXT = (
    "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, \"CA\"\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=threshold>\ninf\n</parameter>\n"
    "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
)


def test_qwen3_coder_calls_and_types_at_every_split():
    reference = None
    for content, deltas in all_splits("qwen3_coder", QWEN3_CODER_TEXT):
        calls = [(c.name, json.loads(c.arguments)) for c in assemble(deltas)]
        if reference is None:
            reference = (content, calls)
        assert (content.strip(), calls) == (reference[0].strip(), reference[1])
    content, calls = reference
    assert content.strip() == "Let me check."
    assert calls[0] == ("get_weather", {"city": 'San Francisco, "CA"', "days": 3, "metric": True, "threshold": "inf", "tags": ["a", "b"]})
    assert calls[1] == ("get_weather", {"city": "Paris"})


def test_qwen3_coder_streams_string_arguments_as_generated():
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n</function>\n</tool_call>"
    p = make_tool_parser("qwen3_coder", WEATHER_TOOLS)
    seen = ""
    for i, ch in enumerate(text):
        _, deltas = p.feed(ch)
        seen += "".join(d.arguments for d in deltas)
        if text[: i + 1].endswith("San Fran"):
            assert seen.endswith('"San Fran'), seen  # streamed before the parameter closed
    assert json.loads(seen) == {"city": "San Francisco"}


HERMES_TEXT = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call><tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call> done'


def test_hermes_at_every_split():
    results = {(c, json.dumps([(x.name, json.loads(x.arguments)) for x in assemble(d)])) for c, d in all_splits("hermes", HERMES_TEXT)}
    assert len(results) == 1
    content, calls = results.pop()
    assert content == "Sure. done"
    assert json.loads(calls) == [["get_weather", {"city": "Oslo", "days": 2}], ["get_weather", {"city": "Rome"}]]


def test_text_that_only_looks_like_a_call_stays_content():
    for content, deltas in all_splits("hermes", "a <tool_call>not json</tool_call> b <tool_ca"):
        assert deltas == []
        assert content == "a <tool_call>not json</tool_call> b <tool_ca"


# ---- reasoning, by token id, through Generation with a real tokenizer ------------------------

def out(tokens, finished=False, reason="length"):
    toks = [SimpleNamespace(token=t, logprob=0.0, top_logprobs=[]) for t in tokens]
    return SimpleNamespace(tokens=toks, finished=finished, finish_reason=reason if finished else "none", stop_token_id=-1)


def replay(tok, ids, *, stop=(), starts_in_reasoning=False, enabled=True, chunk=1):
    rt = qwen3_reasoning_tokens(tok)
    g = Generation(tok, list(stop), False, True, ReasoningRouter(rt, starts_in_reasoning, enabled))
    reasoning = content = ""
    for i in range(0, len(ids), chunk):
        d = g.feed(out(ids[i:i + chunk], finished=i + chunk >= len(ids)))
        reasoning += d.reasoning
        content += d.content
        if g.finish_reason:
            break
    return reasoning, content, g


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 100])
def test_reasoning_split_by_token_id(think_tokenizer, chunk):
    tok = think_tokenizer
    ids = tok.encode("<think>I should say hi. Maybe.</think>Hello there.", add_special_tokens=False)
    reasoning, content, _ = replay(tok, ids, chunk=chunk)
    assert reasoning == "I should say hi. Maybe."
    assert content == "Hello there."


def test_template_that_opens_think_itself(think_tokenizer):
    tok = think_tokenizer
    prompt = tok.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    rt = qwen3_reasoning_tokens(tok)
    assert prompt_opens_reasoning(prompt, rt)
    assert not prompt_opens_reasoning(tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False), rt)
    ids = tok.encode("plan it</think>answer", add_special_tokens=False)
    reasoning, content, _ = replay(tok, ids, starts_in_reasoning=True)
    assert (reasoning, content) == ("plan it", "answer")


def test_thinking_off_means_all_content(think_tokenizer):
    tok = think_tokenizer
    ids = tok.encode("<think>x</think>y", add_special_tokens=False)
    reasoning, content, _ = replay(tok, ids, enabled=False)
    assert reasoning == "" and content == "<think>x</think>y"


def test_stop_strings_only_after_reasoning(think_tokenizer):
    tok = think_tokenizer
    ids = tok.encode("<think>wait. STOP here</think>Answer: 42. STOP more", add_special_tokens=False)
    reasoning, content, g = replay(tok, ids, stop=["STOP"])
    assert reasoning == "wait. STOP here"
    assert content == "Answer: 42. "
    assert g.finish_reason == "stop" and g.stop_reason == "STOP"


def test_tool_call_before_end_of_reasoning_ends_it(think_tokenizer):
    tok = think_tokenizer
    ids = tok.encode("<think>need weather<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>", add_special_tokens=False)
    reasoning, content, _ = replay(tok, ids)
    assert reasoning == "need weather"
    assert content.startswith("<tool_call>")
    _, deltas = make_tool_parser("hermes", WEATHER_TOOLS).feed(content)
    assert [d.name for d in deltas] == ["get_weather"]


def test_qwen3_coder_keeps_the_first_of_a_repeated_parameter():
    """A parameter given twice would make a duplicate JSON key: the second value is dropped, at every split."""
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
            "<parameter=city>\nRome\n</parameter>\n<parameter=days>\n5\n</parameter>\n</function>\n</tool_call>")
    for _, deltas in all_splits("qwen3_coder", text):
        (call,) = assemble(deltas)
        pairs = json.loads(call.arguments, object_pairs_hook=lambda kv: kv)
        assert pairs == [("city", "Oslo"), ("days", 2)], call.arguments
