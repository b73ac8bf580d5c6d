"""Grammars that force tool calls (tool_choice "required" / a named function; Anthropic "any" /
"tool"), or (tool_choice "auto" beside a JSON response format) allow either calls or the JSON
answer: the output is one call, or several, in the active tool-call format (hermes:
<tool_call>{"name", "arguments"}</tool_call>; qwen3_coder: <function=...><parameter=...>), each call's
arguments held to its function's JSON schema. Written in llguidance's Lark dialect, whose %json
embeds a JSON schema."""

from __future__ import annotations

import json
from typing import Any

from revolta.guided import closed_objects

_COMPACT = {"x-guidance": {"whitespace_flexible": False}}  # no runs of whitespace inside the JSON


def _lit(s: str) -> str:
    return json.dumps(s)


def _schema(fn: dict[str, Any]) -> dict[str, Any]:
    """The function's parameters, objects closed to keys they do not name (as strict function
    calling has them)."""
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return closed_objects(params) if isinstance(params, dict) else {"type": "object", "additionalProperties": False}


def _hermes_call(fns: list[dict[str, Any]]) -> str:
    options = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": _schema(f)},
                "required": ["name", "arguments"], "additionalProperties": False} for f in fns]
    schema = {**(options[0] if len(options) == 1 else {"anyOf": options}), **_COMPACT}
    return f'call: "<tool_call>\\n" %json {json.dumps(schema)} "\\n</tool_call>"'


def _string_value(prop: dict[str, Any]) -> str:
    """A qwen3_coder string parameter is raw text on its own lines: one line, within its length
    bounds, or one of its enum values."""
    if isinstance(prop.get("enum"), list) and all(isinstance(v, str) for v in prop["enum"]):
        return "(" + " | ".join(_lit(v) for v in prop["enum"]) + ")"
    lo, hi = int(prop.get("minLength", 1)), prop.get("maxLength")
    return f"/[^\\n]{{{max(lo, 1)},{'' if hi is None else int(hi)}}}/"


def _qwen3_coder_call(fns: list[dict[str, Any]]) -> str:
    rules, alternatives = [], []
    for i, f in enumerate(fns):
        schema = _schema(f)
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        parts = []
        for j, (key, prop) in enumerate(props.items()):
            prop = prop if isinstance(prop, dict) else {}
            value = _string_value(prop) if prop.get("type") == "string" else f"%json {json.dumps({**prop, **_COMPACT})}"
            rule = f"p{i}_{j}"
            rules.append(f'{rule}: "<parameter=" {_lit(key)} ">\\n" {value} "\\n</parameter>\\n"')
            parts.append(rule if key in required else f"{rule}?")
        body = " ".join(parts)
        alternatives.append(f'"<function=" {_lit(f["name"])} ">\\n" {body} "</function>"'.replace("  ", " "))
    return "\n".join(['call: "<tool_call>\\n" fn "\\n</tool_call>"', "fn: " + " | ".join(alternatives), *rules])


def tool_call_grammar(parser: str, tools: list[dict[str, Any]], name: str | None, parallel: bool) -> str:
    """The Lark grammar of forced calls; name: the one function allowed (else any of the tools)."""
    fns = [t["function"] for t in tools if t.get("type", "function") == "function"]
    if name is not None:
        fns = [f for f in fns if f["name"] == name]
    if not fns:
        raise ValueError(f"tool_choice: no tool named {name!r}" if name else "tool_choice: no tools to call")
    calls = 'start: call ("\\n" call)*' if parallel else "start: call"
    body = _hermes_call(fns) if parser == "hermes" else _qwen3_coder_call(fns)
    return calls + "\n" + body


def calls_or_answer_grammar(parser: str, tools: list[dict[str, Any]], parallel: bool, answer_schema: str) -> str:
    """tool_choice "auto" with a JSON answer format: the output is tool calls (as forced ones are) or
    the answer held to `answer_schema` (a JSON schema's text), whichever the model starts."""
    first, rules = tool_call_grammar(parser, tools, None, parallel).split("\n", 1)
    return f"start: calls | answer\ncalls: {first.removeprefix('start: ')}\nanswer: %json {answer_schema}\n{rules}"
