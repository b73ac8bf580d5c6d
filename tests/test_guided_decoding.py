"""Constrained decoding (SamplingParams(guided_decoding=...), vLLM's spelling) on the demo model at
temperature 1 over many seeds: every output parses and validates against its schema (jsonschema),
matches its regex, or is one of its choices; a bad schema is a ValueError naming the field."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from revolta import LLM, GuidedDecodingParams, SamplingParams
from revolta.guided import ReasoningGate, closed_objects

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "city": {"enum": ["Oslo", "Paris", "Lima"]}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                                         "maxItems": 3}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm():
    engine = LLM(max_model_len=512)
    yield engine
    engine.engine.shutdown()


def sample(llm, prompt, guided, seeds, max_tokens=160):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=max_tokens, guided_decoding=guided) for s in seeds]
    return [o.outputs[0] for o in llm.generate([prompt] * len(params), params)]


def test_json_schema_outputs_validate(llm):
    outs = sample(llm, "Describe a person as JSON.", GuidedDecodingParams(json=PERSON), range(12))
    for o in outs:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), PERSON)


def test_json_object_regex_and_choice(llm):
    objects = sample(llm, "Reply with JSON.", {"json_object": True}, range(6))
    for o in objects:  # (an unbounded object may run to max_tokens: only finished ones must parse)
        assert o.finish_reason == "length" or isinstance(json.loads(o.text), dict), o.text
        assert not re.search(r"\n[ \t]*\n", o.text), o.text  # whitespace is bounded: no blank lines
    assert sum(o.finish_reason == "stop" for o in objects) >= 3
    pattern = r"[A-Z][a-z]{2,8}-\d{3}"
    for o in sample(llm, "Give a code.", {"regex": pattern}, range(6), 20):
        assert re.fullmatch(pattern, o.text), o.text
    choices = ["red", "green", "blue"]
    assert {o.text for o in sample(llm, "Pick a colour.", {"choice": choices}, range(8), 10)} <= set(choices)
    lark = 'start: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]+/'
    for o in sample(llm, "Answer.", {"grammar": lark}, range(6), 10):
        assert re.fullmatch(r"yes|no|maybe [0-9]+", o.text), o.text


def test_json_without_whitespace(llm):
    for guided in (GuidedDecodingParams(json=PERSON, disable_any_whitespace=True),
                   {"json_object": True, "disable_any_whitespace": True}):
        outs = sample(llm, "Describe a person as JSON, one field a line.", guided, range(4))
        assert sum(o.finish_reason == "stop" for o in outs) >= 2
        for o in outs:
            if o.finish_reason == "length":
                continue
            value = json.loads(o.text)
            assert json.dumps(value, separators=(",", ":"), ensure_ascii=False) == o.text, o.text


def test_objects_closed_on_request(llm):
    """disable_additional_properties (and strict json_schema, forced tool calls): objects that leave
    additionalProperties out take only their named keys; an explicit additionalProperties stays."""
    nested = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}},
                                               "c": {"type": "array", "items": {"$ref": "#/$defs/d"}},
                                               "e": {"type": "object", "additionalProperties": True}},
              "$defs": {"d": {"anyOf": [{"type": "object", "properties": {"f": {"type": "string"}}}, {"type": "null"}]}}}
    closed = closed_objects(nested)
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    assert closed["$defs"]["d"]["anyOf"][0]["additionalProperties"] is False and "additionalProperties" not in nested
    assert closed["properties"]["e"]["additionalProperties"] is True
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"]}
    outs = sample(llm, "Describe a person as JSON with many fields.",
                  GuidedDecodingParams(json=schema, disable_additional_properties=True), range(6), 60)
    assert sum(o.finish_reason == "stop" for o in outs) >= 4
    for o in outs:
        if o.finish_reason == "stop":
            assert set(json.loads(o.text)) == {"name"}, o.text


def test_unconstrained_sampling_would_fail_the_schema(llm):
    """The check above can fail: the same prompts without the grammar do not give valid JSON."""
    outs = [o.outputs[0] for o in llm.generate(["Describe a person as JSON."] * 6,
                                               [SamplingParams(temperature=1.0, seed=s, max_tokens=80) for s in range(6)])]
    valid = 0
    for o in outs:
        try:
            jsonschema.validate(json.loads(o.text), PERSON)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    assert valid < len(outs)


def test_bad_grammars_name_the_field(llm):
    with pytest.raises(ValueError, match="guided_decoding"):
        llm.generate("x", SamplingParams(guided_decoding={"json": {"type": "nonsense"}}))
    with pytest.raises(ValueError, match="exactly one"):
        SamplingParams(guided_decoding={"json": {}, "regex": "a"}).to_core(16)
    with pytest.raises(ValueError, match="unknown field"):
        SamplingParams(guided_decoding={"jsonschema": {}})
    with pytest.raises(ValueError, match="guided_decoding"):
        llm.generate("x", SamplingParams(guided_decoding={"regex": "(unclosed"}))
    # The engine goes on serving.
    assert llm.generate("Hi", SamplingParams(temperature=0, max_tokens=3))[0].outputs[0].token_ids


def test_an_llguidance_without_the_c_api_is_a_startup_error(monkeypatch):
    """The engine calls llguidance's C API as of 1.7.0 (llg_new_tokenizer_v2): an older one installed
    stops the engine before it loads anything, naming both versions; 1.7.0 itself is taken."""
    import importlib.metadata

    from revolta import guided

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.6.1")
    with pytest.raises(ValueError, match=r"llguidance 1\.6\.1 is installed; .* as of 1\.7\.0 .*llguidance>=1\.7\.0"):
        LLM(max_model_len=512)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.7.0")
    assert guided.grammar_library().endswith(".so")


def greedy(llm, prompt, n, **kw):
    return llm.generate(prompt, SamplingParams(temperature=0, max_tokens=n, **kw))[0].outputs[0].token_ids


def test_grammar_starts_after_the_reasoning(llm):
    """guided_after: the tokens up to the end-of-reasoning token are the model's own (the same greedy
    tokens as without a grammar), and from the next one on the grammar holds. Here ordinary tokens
    of the demo's greedy answer stand in for <think> and </think>."""
    prompt, digits = "Tell me about the sea.", GuidedDecodingParams(regex=r"[0-9]{3}")
    free = greedy(llm, prompt, 12)
    assert not re.fullmatch(r"[0-9]{3}", llm.tokenizer.decode(free[:3]))
    end = free[5]
    cut = free.index(end) + 1  # (the first time it comes)
    gated = greedy(llm, prompt, 40, guided_decoding=digits, guided_after=ReasoningGate(start=None, end=end, in_reasoning=True))
    assert gated[:cut] == free[:cut]
    assert re.fullmatch(r"[0-9]{3}", llm.tokenizer.decode(gated[cut:]))
    # No reasoning open in the prompt, and the model does not open it: the grammar holds from the start.
    start_elsewhere = next(t for t in range(1000, 2000) if t not in free)
    out = greedy(llm, prompt, 40, guided_decoding=digits, guided_after=ReasoningGate(start=start_elsewhere, end=end))
    assert re.fullmatch(r"[0-9]{3}", llm.tokenizer.decode(out))
    # The model's first token opens the reasoning (the answer's first token may be `start`).
    out = greedy(llm, prompt, 40, guided_decoding=digits, guided_after=ReasoningGate(start=free[0], end=end))
    assert out[:cut] == free[:cut] and re.fullmatch(r"[0-9]{3}", llm.tokenizer.decode(out[cut:]))


def test_answer_token_ends_the_reasoning_inside_the_answer(llm):
    """`answer` (<tool_call> for Qwen3) ends the reasoning as the grammar's first token."""
    prompt = "Tell me about the sea."
    free = greedy(llm, prompt, 12)
    answer = free[4]
    cut = free.index(answer)
    text = llm.tokenizer.decode([answer])
    grammar = GuidedDecodingParams(regex=re.escape(text) + r"[0-9]{2}")
    never = next(t for t in range(1000, 2000) if t not in free)
    out = greedy(llm, prompt, 40, guided_decoding=grammar, guided_after=ReasoningGate(start=None, end=never, answer=answer,
                                                                                      in_reasoning=True))
    assert out[:cut + 1] == free[:cut + 1]
    assert re.fullmatch(re.escape(text) + r"[0-9]{2}", llm.tokenizer.decode(out[cut:]))


def test_logit_bias_moves_the_choice(llm):
    """OpenAI's logit_bias: -100 bans the greedy token, +100 picks any token, sampled or greedy; out of
    range or vocabulary is a ValueError naming the field."""
    prompt = "Tell me about the sea."
    free = greedy(llm, prompt, 4)
    banned = greedy(llm, prompt, 4, logit_bias={free[0]: -100.0})
    assert banned[0] != free[0]
    forced = 1234
    assert greedy(llm, prompt, 3, logit_bias={forced: 100.0}) == [forced] * 3
    outs = llm.generate([prompt] * 4, [SamplingParams(temperature=1.0, seed=s, max_tokens=3, logit_bias={forced: 100.0})
                                       for s in range(4)])
    assert all(o.outputs[0].token_ids == [forced] * 3 for o in outs)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={forced: 101.0})
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(prompt, SamplingParams(logit_bias={10**7: 1.0}))
