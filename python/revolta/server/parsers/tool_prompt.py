"""Tools described in the prompt for chat templates that do not render them (the demo model's
drops `tools` silently): a system-prompt section in the active tool-call format, so the model sees
its tools and how to call them, and the parser reads what it writes."""

from __future__ import annotations

import json
from typing import Any

_PROBE_TOOL = [{"type": "function", "function": {"name": "revolta_probe_tool", "parameters": {"type": "object"}}}]

_HOW = {
    "hermes": ("To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call> "
               "tags, one call per tag:\n<tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"arg\": \"value\"}}"
               "\n</tool_call>"),
    "qwen3_coder": ("To call a function, write its name and each argument inside <tool_call></tool_call> tags, one "
                    "argument per parameter tag:\n<tool_call>\n<function=function_name>\n<parameter=arg>\nvalue\n"
                    "</parameter>\n</function>\n</tool_call>"),
}


def template_renders_tools(render) -> bool:
    """render(messages, tools) -> text; whether the template puts the tools into the prompt."""
    msgs = [{"role": "user", "content": "hello"}]
    try:
        return "revolta_probe_tool" in render(msgs, _PROBE_TOOL)
    except Exception:  # a template that fails on tools does not render them either
        return False


def tools_section(parser: str, tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return f"# Tools\n\nThese functions are available:\n<tools>\n{lines}\n</tools>\n\n{_HOW[parser]}"


def with_tools_section(messages: list[dict[str, Any]], parser: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with the tools section added to the system message (a new one when there is none)."""
    section = tools_section(parser, tools)
    if messages and messages[0].get("role") in ("system", "developer"):
        first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{section}".strip())
        return [first, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]
