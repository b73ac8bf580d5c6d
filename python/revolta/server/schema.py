"""What every request body model shares: strict parsing and integers that fit the engine."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from revolta.server.errors import APIError

INT32_MAX = 2**31 - 1

# Strict: "10" is not a number and true is not 1 (a client sending them has a bug worth hearing
# about); unknown fields are accepted and ignored, as the APIs' own servers do.
# NaN and infinities are not numbers a sampling field can take (JSON has neither; Python's parser
# reads them): "should be a finite number" says so, not a bound they fail.
STRICT = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Count = Annotated[int, Field(ge=1, le=INT32_MAX)]
# vLLM's request `priority`: lower is served first (with --scheduling-policy priority).
Priority = Annotated[int, Field(ge=-INT32_MAX - 1, le=INT32_MAX)]


class RequestModel(BaseModel):
    model_config = STRICT


def check_texts(body: Any) -> None:
    """Raises a 400 naming the first string of a parsed request body that no tokenizer can encode:
    a lone surrogate (JSON "\\ud800") parses into a Python str. Iterative: bodies nest deeply."""
    stack: list[tuple[Any, str]] = [(body, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise APIError(400, f"{where or 'body'}: text holds an unpaired surrogate at position {e.start}",
                               param=where or None) from e
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k, where))
                stack.append((v, f"{where}.{k}" if where else str(k)))
        elif isinstance(value, list):
            stack.extend((v, f"{where}.{i}") for i, v in enumerate(value))
