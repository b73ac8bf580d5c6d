"""Errors in the OpenAI shape {"error": {"message", "type", "param", "code"}} or, on the Messages
API, in Anthropic's {"type": "error", "error": {"type", "message"}}."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

# Error type by HTTP status, as Anthropic names them; the OpenAI shape uses the same names except
# for its internal errors. Unlisted statuses are "api_error".
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_TYPES = {**_ANTHROPIC_TYPES, 500: "internal_error"}


def anthropic_error_body(status: int, message: str) -> dict:
    """Anthropic's shape: the error type follows from the status (other 5xx: api_error)."""
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "api_error"), "param": param, "code": code or status}}


def error_response(e: APIError, path: str = "") -> JSONResponse:
    return json_error(path, e.status, e.message, e.param, e.code, e.headers)


def json_error(path: str, status: int, message: str, param: str | None = None, code: str | None = None,
               headers: dict[str, str] | None = None) -> JSONResponse:
    body = anthropic_error_body(status, message) if is_anthropic_path(path) else error_body(status, message, param, code)
    return JSONResponse(body, status_code=status, headers=headers)


def sse_error(e: APIError) -> str:
    """The OpenAI APIs' error in a stream that has started: an error chunk, then the end marker."""
    return "data: " + json.dumps(error_body(e.status, e.message, e.param, e.code), ensure_ascii=False) + "\n\ndata: [DONE]\n\n"


# Request-body validation errors as one 400: pydantic reports each member of a union that failed
# (a string `input` that is a list also fails as a string); the body's own problem is the deepest
# error that is not another member's type mismatch, located without pydantic's member labels.


def _is_member_label(part) -> bool:
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "list", "dict", "none") or "[" in part)


def body_location(err: dict) -> list:
    loc = list(err.get("loc", ()))
    if loc and loc[0] == "body":
        loc = loc[1:]
    return [x for x in loc if not _is_member_label(x)]


def telling_error(errors: list[dict]) -> dict:
    return max(errors, key=lambda e: (len(body_location(e)), not str(e.get("type", "")).endswith("_type")), default={})


def error_message(err: dict) -> str:
    ctx = err.get("ctx") or {}
    if err.get("type") == "union_tag_invalid":
        return f"type '{ctx.get('tag')}' is not one this server takes ({ctx.get('expected_tags')})"
    return str(err.get("msg", "invalid request")).removeprefix("Value error, ")
