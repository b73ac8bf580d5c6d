"""Constrained decoding options with vLLM's names (GuidedDecodingParams: json, regex, choice, grammar,
json_object), turned into the engine's grammar kinds, and where the grammar library is. The engine
computes each step's token mask through llguidance's C API itself (sample/grammar.h)."""

from __future__ import annotations

import json as _json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


BOUNDED_WHITESPACE = r"[\x20\x09]{1,2}|\x0D?\x0A[\x20\x09]{0,32}"


@dataclass
class ReasoningGate:
    """A thinking model's reasoning before the grammar: the grammar holds only what follows `end`
    (</think>). in_reasoning: the prompt left the block open; otherwise the answer's first token may
    be `start` (<think>), which opens it. `answer` (<tool_call>, or None) also ends the reasoning,
    as the answer's first token."""

    start: int | None
    end: int
    answer: int | None = None
    in_reasoning: bool = False


@dataclass
class GuidedDecodingParams:
    json: str | dict[str, Any] | None = None  # a JSON schema
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # a Lark grammar (llguidance's dialect)
    json_object: bool | None = None  # any JSON object
    # JSON without any whitespace between tokens (vLLM's name); otherwise a bounded amount (_spacing).
    disable_any_whitespace: bool = False
    # Objects that do not say otherwise take no keys beyond their properties (vLLM's name; on for
    # OpenAI's strict json_schema): an unspecified additionalProperties lets a model wander off into
    # keys nobody asked for.
    disable_additional_properties: bool = False
    field_name: str = "guided_decoding"  # the request field it came from, named in errors

    def engine_form(self) -> tuple[str, str]:
        """(kind, data) for the engine; ValueError naming the field when not exactly one is given."""
        given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"{self.field_name}: give exactly one of json, regex, choice, grammar, json_object (got "
                             f"{', '.join(given) or 'none'})")
        if self.json is not None:
            try:
                schema = _json.loads(self.json) if isinstance(self.json, str) else self.json
            except ValueError as e:
                raise ValueError(f"{self.field_name}: the JSON schema is not valid JSON ({e})") from None
            if self.disable_additional_properties:
                schema = closed_objects(schema)
            return "json", _json.dumps(self._spacing(schema))
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("guided_decoding: choice must be a list of non-empty strings")
            return "lark", "start: " + " | ".join(_json.dumps(c) for c in self.choice)
        if self.grammar is not None:
            return "lark", self.grammar
        return "json", _json.dumps(self._spacing({"type": "object"}))  # any JSON object

    def _spacing(self, schema: Any) -> Any:
        """Whitespace between JSON tokens: none with disable_any_whitespace; else a space or two, or
        one line break and its indentation (enough for pretty-printed JSON), so that a model cannot
        fill max_tokens with blank lines (JSON itself allows any run). A schema's own x-guidance
        whitespace settings stay."""
        if not isinstance(schema, dict):
            return schema
        own = schema.get("x-guidance", {})
        if not self.disable_any_whitespace and ("whitespace_pattern" in own or "whitespace_flexible" in own):
            return schema
        spacing = {"whitespace_flexible": False} if self.disable_any_whitespace else {"whitespace_pattern": BOUNDED_WHITESPACE}
        return {**schema, "x-guidance": {**own, **spacing}}

    @classmethod
    def of(cls, value: "GuidedDecodingParams | dict[str, Any]") -> "GuidedDecodingParams":
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError("guided_decoding must be a GuidedDecodingParams or a dict of its fields")
        fields = {"json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace",
                  "disable_additional_properties", "field_name"}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(f"guided_decoding: unknown field(s) {', '.join(unknown)}")
        return cls(**value)


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def closed_objects(schema: Any) -> Any:
    """A copy of the JSON schema in which every object schema that leaves additionalProperties out
    has it false."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(v) for v in out[key]]
    for key in ("items", "additionalProperties", "not", "if", "then", "else"):
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


# The first llguidance whose C API has every function the engine calls (llg_new_tokenizer_v2 came
# in 1.7.0); pyproject.toml requires the same.
LLGUIDANCE_MIN = (1, 7, 0)


def _version_tuple(text: str) -> tuple[int, ...]:
    """'1.10.2rc1' -> (1, 10, 2): each release part's leading digits."""
    return tuple(int(m.group()) if (m := re.match(r"\d+", piece)) else 0 for piece in text.split(".")[:3])


def grammar_library() -> str:
    """The llguidance wheel's library, whose C functions the engine calls; "" when not installed. An
    llguidance older than LLGUIDANCE_MIN is a startup error naming both versions."""
    try:
        import llguidance._lib as lib
    except ImportError:
        return ""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("llguidance")
    except PackageNotFoundError:  # a source tree on the path: nothing to check against
        installed = ""
    if installed and _version_tuple(installed) < LLGUIDANCE_MIN:
        need = ".".join(map(str, LLGUIDANCE_MIN))
        raise ValueError(f"llguidance {installed} is installed; guided decoding calls llguidance's C API as of {need} "
                         f"(llg_new_tokenizer_v2): pip install 'llguidance>={need}'")
    return str(Path(lib.__file__).resolve())


def from_request(response_format: dict[str, Any] | None, guided_json=None, guided_regex=None, guided_choice=None,
                 guided_grammar=None) -> GuidedDecodingParams | None:
    """The OpenAI response_format ({"type": "text" | "json_object" | "json_schema", "json_schema":
    {"name", "schema", "strict"}}) or one of vLLM's guided_* extras; ValueError naming the field."""
    extras = {k: v for k, v in (("guided_json", guided_json), ("guided_regex", guided_regex),
                                ("guided_choice", guided_choice), ("guided_grammar", guided_grammar)) if v is not None}
    fmt = response_format or {}
    kind = fmt.get("type", "text") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise ValueError(f"response_format: type must be text, json_object or json_schema, got {kind!r}")
    if kind != "text" and extras:
        raise ValueError(f"response_format and {', '.join(extras)} exclude each other")
    if len(extras) > 1:
        raise ValueError(f"{' and '.join(extras)} exclude each other: give one of them")
    if kind == "json_object":
        return GuidedDecodingParams(json_object=True, field_name="response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("response_format: json_schema needs {\"name\": ..., \"schema\": {...}}")
        strict = bool(spec.get("strict"))
        return GuidedDecodingParams(json=schema, disable_additional_properties=strict, field_name="response_format")
    if not extras:
        return None
    (name, value), = extras.items()
    return GuidedDecodingParams(field_name=name, **{name[len("guided_"):]: value})
