"""Tool-call parsers over streamed content text.

Each parser is a state machine fed text in arbitrary chunks. It returns the content that is
certainly not part of a tool call (a possible partial `<tool_call>` at the end is held back) and
tool-call deltas in OpenAI's streaming shape. Non-streaming responses are assembled from the same
deltas, so both modes give the same calls by construction.
"""

from __future__ import annotations

import abc
import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class AssembledCall:
    id: str
    name: str
    arguments: str = ""


def assemble(deltas: list[ToolCallDelta]) -> list[AssembledCall]:
    calls: dict[int, AssembledCall] = {}
    for d in deltas:
        c = calls.setdefault(d.index, AssembledCall(id=d.id or "", name=d.name or ""))
        if d.id:
            c.id = d.id
        if d.name:
            c.name = d.name
        c.arguments += d.arguments
    return [calls[i] for i in sorted(calls)]


def _partial_suffix(buf: str, marker: str) -> int:
    """Length of the longest suffix of buf that is a proper prefix of marker."""
    for n in range(min(len(buf), len(marker) - 1), 0, -1):
        if marker.startswith(buf[-n:]):
            return n
    return 0


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ToolParser(abc.ABC):
    name = ""

    def __init__(self, tools: list[dict[str, Any]] | None):
        self.schemas: dict[str, dict[str, Any]] = {}
        for t in tools or []:
            fn = t.get("function", t)
            if isinstance(fn, dict) and fn.get("name"):
                self.schemas[fn["name"]] = (fn.get("parameters") or {}).get("properties") or {}
        self.buf = ""
        self.index = -1

    @abc.abstractmethod
    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Takes the next piece of content; returns (content to emit, tool-call deltas)."""

    @abc.abstractmethod
    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """Flushes at the end of generation (held-back text, nothing for a call cut short)."""

    def _take_text(self) -> tuple[str, bool]:
        """In text state: returns (content to emit, whether a call opens at the buffer start)."""
        i = self.buf.find(CALL_OPEN)
        if i >= 0:
            out, self.buf = self.buf[:i], self.buf[i + len(CALL_OPEN):]
            return out, True
        keep = _partial_suffix(self.buf, CALL_OPEN)
        out = self.buf[: len(self.buf) - keep]
        self.buf = self.buf[len(self.buf) - keep:]
        return out, False


class HermesToolParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; a call is emitted whole."""

    name = "hermes"

    def __init__(self, tools):
        super().__init__(tools)
        self.in_call = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self.buf += text
        content, deltas = "", []
        while True:
            if not self.in_call:
                out, opened = self._take_text()
                content += out
                if not opened:
                    return content, deltas
                self.in_call = True
            j = self.buf.find(CALL_CLOSE)
            if j < 0:
                return content, deltas
            raw, self.buf = self.buf[:j], self.buf[j + len(CALL_CLOSE):]
            self.in_call = False
            try:
                obj = json.loads(raw)
                name = obj["name"]
                args = obj.get("arguments", obj.get("parameters", {}))
                args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            except (ValueError, KeyError, TypeError):
                content += CALL_OPEN + raw + CALL_CLOSE  # not a call after all: keep it as text
                continue
            self.index += 1
            deltas.append(ToolCallDelta(index=self.index, id=_new_id(), name=name, arguments=args_text))

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        rest = (CALL_OPEN if self.in_call else "") + self.buf
        self.buf, self.in_call = "", False
        return rest, []


class Qwen3CoderToolParser(ToolParser):
    """`<tool_call><function=NAME><parameter=K>value</parameter>...</function></tool_call>`.

    Arguments are streamed as a JSON object: string values character by character as they are
    generated, other values once complete, coerced to the type the tool's JSON schema gives
    (numbers that are not finite stay strings).
    """

    name = "qwen3_coder"
    FN_OPEN, FN_CLOSE, P_OPEN, P_CLOSE = "<function=", "</function>", "<parameter=", "</parameter>"

    def __init__(self, tools):
        super().__init__(tools)
        self.state = "text"  # text | header | params | value | tail
        self.fn = ""
        self.key = ""
        self.n_params = 0
        self.value_started = False
        self.value = ""
        self.seen: set[str] = set()  # this call's parameters so far
        self.skip = False  # a parameter given twice: its second value is dropped (JSON keys are unique)

    def _param_type(self) -> str | None:
        prop = self.schemas.get(self.fn, {}).get(self.key)
        t = prop.get("type") if isinstance(prop, dict) else None
        if isinstance(t, list):
            t = next((x for x in t if x != "null"), None)
        return t

    def _coerce(self, raw: str) -> Any:
        t = self._param_type()
        v = raw.strip()
        try:
            if t == "integer":
                return int(v)
            if t == "number":
                f = float(v)
                if not math.isfinite(f):
                    return v
                return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f
            if t == "boolean":
                if v.lower() in ("true", "false"):
                    return v.lower() == "true"
                return v
            if t in ("object", "array"):
                return json.loads(v)
            if t == "null" and v == "null":
                return None
            if t is None:
                parsed = json.loads(v)
                if isinstance(parsed, float) and not math.isfinite(parsed):
                    return v
                return parsed
        except ValueError:
            pass
        return raw

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self.buf += text
        content, deltas = "", []
        while True:
            progressed, out = self._step(deltas)
            content += out
            if not progressed:
                return content, deltas

    def _args(self, deltas: list[ToolCallDelta], frag: str) -> None:
        if frag:
            deltas.append(ToolCallDelta(index=self.index, arguments=frag))

    def _step(self, deltas: list[ToolCallDelta]) -> tuple[bool, str]:
        if self.state == "text":
            out, opened = self._take_text()
            if opened:
                self.state = "header"
            return opened, out
        if self.state == "header":
            b = self.buf.lstrip()
            if not b:
                self.buf = ""
                return False, ""
            if not b.startswith(self.FN_OPEN):
                if len(b) < len(self.FN_OPEN) and self.FN_OPEN.startswith(b):
                    return False, ""
                # Not this format: give the text back as content.
                self.state = "text"
                self.buf = b
                return True, CALL_OPEN
            end = b.find(">")
            if end < 0:
                return False, ""
            self.fn = b[len(self.FN_OPEN):end].strip()
            self.buf = b[end + 1:]
            self.index += 1
            self.n_params = 0
            self.seen = set()
            deltas.append(ToolCallDelta(index=self.index, id=_new_id(), name=self.fn, arguments=""))
            self.state = "params"
            return True, ""
        if self.state == "params":
            b = self.buf.lstrip()
            if b.startswith(self.P_OPEN):
                end = b.find(">")
                if end < 0:
                    self.buf = b
                    return False, ""
                self.key = b[len(self.P_OPEN):end].strip()
                self.buf = b[end + 1:]
                self.state = "value"
                self.value_started = False
                self.value = ""
                self.skip = self.key in self.seen
                if self.skip:
                    return True, ""
                self.seen.add(self.key)
                self._args(deltas, ("{" if self.n_params == 0 else ", ") + json.dumps(self.key) + ": ")
                self.n_params += 1
                if self._param_type() in ("string", None) and self._streams_as_string():
                    self._args(deltas, '"')
                return True, ""
            if b.startswith(self.FN_CLOSE):
                self.buf = b[len(self.FN_CLOSE):]
                self._args(deltas, "}" if self.n_params else "{}")
                self.state = "tail"
                return True, ""
            self.buf = b
            return False, ""
        if self.state == "value":
            j = self.buf.find(self.P_CLOSE)
            chunk = self.buf if j < 0 else self.buf[:j]
            if j < 0:
                # Hold back what could still be the closing tag or the newline before it.
                keep = _partial_suffix(chunk, "\n" + self.P_CLOSE)
                if chunk.endswith("\n"):
                    keep = max(keep, 1)
                chunk, self.buf = chunk[: len(chunk) - keep], chunk[len(chunk) - keep:]
            else:
                self.buf = self.buf[j + len(self.P_CLOSE):]
                if chunk.endswith("\n"):
                    chunk = chunk[:-1]
            if not self.value_started and chunk:
                if chunk.startswith("\n"):
                    chunk = chunk[1:]
                self.value_started = True
            self.value += chunk
            streaming = not self.skip and self._param_type() in ("string", None) and self._streams_as_string()
            if streaming and chunk:
                self._args(deltas, json.dumps(chunk, ensure_ascii=False)[1:-1])
            if j < 0:
                return False, ""
            if streaming:
                self._args(deltas, '"')
            elif not self.skip:
                self._args(deltas, json.dumps(self._coerce(self.value), ensure_ascii=False))
            self.state = "params"
            return True, ""
        # tail: after </function>, wait for </tool_call>
        j = self.buf.find(CALL_CLOSE)
        if j < 0:
            return False, ""
        self.buf = self.buf[j + len(CALL_CLOSE):]
        self.state = "text"
        return True, ""

    def _streams_as_string(self) -> bool:
        # Untyped parameters of unknown tools are streamed as strings too; typed non-string ones
        # wait for their whole value.
        return self._param_type() == "string" or (self._param_type() is None and self.fn not in self.schemas)

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        if self.state == "text":
            rest, self.buf = self.buf, ""
            return rest, []
        return "", []  # a call cut short stays as far as it got


TOOL_PARSERS = {"hermes": HermesToolParser, "qwen3_coder": Qwen3CoderToolParser}


def make_tool_parser(name: str, tools: list[dict[str, Any]] | None) -> ToolParser:
    return TOOL_PARSERS[name](tools)
