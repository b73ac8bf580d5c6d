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

    def engine_form(self) -> tuple[str, str]:
        """(kind, data) for the engine; ValueError naming the field when not exactly one is given."""
        given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"guided_decoding: give exactly one of json, regex, choice, grammar, json_object (got "
                             f"{', '.join(given) or 'none'})")
        if self.json is not None:
            return "json", self.json if isinstance(self.json, str) else _json.dumps(self.json)
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
        unknown = sorted(set(value) - {"json", "regex", "choice", "grammar", "json_object"})
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
