"""The request types every API shares: the sampling fields, and the chat request that the OpenAI
chat endpoint takes and the Anthropic Messages and Responses APIs are translated into (the
pipeline renders and samples only this one form)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from revolta.server.schema import INT32_MAX, Count, Priority, RequestModel, TokenId


MAX_LOGIT_BIAS = 1024  # biased tokens per request (each one is a sampling adjustment every step)


class StreamOptions(RequestModel):
    include_usage: bool = False


def refused_when_set(field: str, why: str):
    """A validator of an API field this server does not honour: any value but an empty one is a 400
    saying why."""
    def check(value: Any) -> Any:
        if value:
            raise ValueError(why)
        return value

    return field_validator(field, mode="after")(check)


class SamplingFields(RequestModel):
    model: str | None = None
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    max_tokens: Count | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=1e6)
    seed: int | None = Field(None, ge=0, lt=2**63)
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = Field(None, ge=0, le=20)  # vLLM's: each prompt token's logprob + N alternatives
    # Structured output: OpenAI's response_format, and vLLM's extra fields.
    response_format: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    priority: Priority = 0
    # OpenAI's: token id (a decimal string) -> a bias added to its logit, in [-100, 100].
    logit_bias: dict[str, float] | None = None
    # Completions: the best n of best_of samples by their summed log-probability (not streamed).
    best_of: int | None = Field(None, ge=1, le=16)

    @field_validator("logit_bias", mode="after")
    @classmethod
    def _bias(cls, v):
        if not v:
            return None
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens may be biased (got {len(v)})")
        out = {}
        for key, bias in v.items():
            if not key.isdigit() or int(key) > INT32_MAX:
                raise ValueError(f"keys must be token ids (decimal integers), got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases must be in [-100, 100], got {bias} for token {key}")
            out[int(key)] = float(bias)
        return out

    @field_validator("best_of", mode="after")
    @classmethod
    def _best_of_is_n(cls, v, info: ValidationInfo):
        n = info.data.get("n", 1)
        if v is not None and v < n:
            raise ValueError(f"best_of must be at least n ({n}), got {v}")
        return v


class MediaURL(RequestModel):
    url: str
    detail: str | None = None


class ContentPart(RequestModel):
    type: str
    text: str | None = None
    image_url: MediaURL | str | None = None  # {"type": "image_url", "image_url": {"url": ...}}
    video_url: MediaURL | str | None = None


class FunctionCall(RequestModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(RequestModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionSpec(RequestModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(RequestModel):
    type: Literal["function"] = "function"
    function: FunctionSpec


def default_when_null(value: Any) -> Any:
    """parallel_tool_calls: null means the API's default, true."""
    return True if value is None else value


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True  # null: the default (OpenAI's API means so)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    # vLLM's: the processor's options for this request's media (with --trust-request-mm-kwargs)
    mm_processor_kwargs: dict[str, Any] | None = None

    _parallel_default = field_validator("parallel_tool_calls", mode="after")(default_when_null)
