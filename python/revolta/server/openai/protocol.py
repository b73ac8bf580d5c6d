"""Request bodies of the OpenAI API (the fields this server reads; others are accepted and ignored)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator

from revolta.server.requests import ChatMessage, ContentPart, SamplingFields, default_when_null, refused_when_set
from revolta.server.schema import Count, Priority, RequestModel, TokenId


class CompletionRequest(SamplingFields):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    # vLLM's beam search: the n best beams (n is the beam width), not streamed, at temperature 0.
    use_beam_search: bool = False
    length_penalty: float = Field(1.0, ge=-10, le=10)

    _no_suffix = refused_when_set("suffix", "not supported by this server (text insertion; leave it out)")


class TokenizeRequest(RequestModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[TokenId]


# ---- Responses API input items -------------------------------------------------------------


class InputMessage(RequestModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(RequestModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"


class FunctionCallOutputItem(RequestModel):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart] = ""


class ReasoningItem(RequestModel):
    type: Literal["reasoning"]
    summary: list[ContentPart] = Field(default_factory=list)
    content: list[ContentPart] | None = None


def _item_kind(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("type", "message")
    return getattr(v, "type", None)


InputItem = Annotated[
    Union[
        Annotated[InputMessage, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
    ],
    Discriminator(_item_kind),
]


class ResponsesTool(RequestModel):
    type: str
    name: str | None = None  # required of function tools (checked where they are read)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ResponsesRequest(RequestModel):
    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True  # null: the default
    max_output_tokens: Count | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "json_schema", "schema": ...}} (structured output)
    stream: bool = False
    previous_response_id: str | None = None
    priority: Priority = 0

    _parallel_default = field_validator("parallel_tool_calls", mode="after")(default_when_null)
