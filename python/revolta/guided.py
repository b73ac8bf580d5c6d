"""Constrained decoding options with vLLM's names (GuidedDecodingParams: json, regex, choice, grammar,
json_object), turned into the engine's grammar kinds, and where the grammar library is. The engine
computes each step's token mask through llguidance's C API itself (sample/grammar.h)."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class GuidedDecodingParams:
    json: str | dict[str, Any] | None = None  # a JSON schema
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # a Lark grammar (llguidance's dialect)
    json_object: bool | None = None  # any JSON object
    # JSON without whitespace between tokens (vLLM's name): a model that keeps emitting newlines
    # between fields cannot run to max_tokens.
    disable_any_whitespace: bool = False
    field_name: str = "guided_decoding"  # the request field it came from, named in errors

    def engine_form(self) -> tuple[str, str]:
        """(kind, data) for the engine; ValueError naming the field when not exactly one is given."""
        given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"{self.field_name}: give exactly one of json, regex, choice, grammar, json_object (got "
                             f"{', '.join(given) or 'none'})")
        if self.json is not None and not self.disable_any_whitespace:
            return "json", self.json if isinstance(self.json, str) else _json.dumps(self.json)
        if self.json is not None or self.json_object:
            schema = _json.loads(self.json) if isinstance(self.json, str) else dict(self.json or {"type": "object"})
            schema["x-guidance"] = {**schema.get("x-guidance", {}), "whitespace_flexible": False}
            return "json", _json.dumps(schema)
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("guided_decoding: choice must be a list of non-empty strings")
            return "lark", "start: " + " | ".join(_json.dumps(c) for c in self.choice)
        if self.grammar is not None:
            return "lark", self.grammar
        return "json_object", ""

    @classmethod
    def of(cls, value: "GuidedDecodingParams | dict[str, Any]") -> "GuidedDecodingParams":
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError("guided_decoding must be a GuidedDecodingParams or a dict of its fields")
        fields = {"json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace", "field_name"}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(f"guided_decoding: unknown field(s) {', '.join(unknown)}")
        return cls(**value)


def grammar_library() -> str:
    """The llguidance wheel's library, whose C functions the engine calls; "" when not installed."""
    try:
        import llguidance._lib as lib
    except ImportError:
        return ""
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
        raise ValueError(f"give one of {', '.join(extras)}")
    if kind == "json_object":
        return GuidedDecodingParams(json_object=True, field_name="response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("response_format: json_schema needs {\"name\": ..., \"schema\": {...}}")
        return GuidedDecodingParams(json=schema, field_name="response_format")
    if not extras:
        return None
    (name, value), = extras.items()
    return GuidedDecodingParams(field_name=name, **{name[len("guided_"):]: value})
