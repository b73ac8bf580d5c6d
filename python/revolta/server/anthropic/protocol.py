"""Request bodies of Anthropic's Messages API (fields read by this server; others are ignored)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field

from revolta.server.schema import INT32_MAX, Count, Priority, RequestModel


class Tool(RequestModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"] = "auto"
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"] = "disabled"
    budget_tokens: int | None = Field(None, ge=0, le=INT32_MAX)


class TextBlock(RequestModel):
    type: Literal["text"]
    text: str


class MediaBlock(RequestModel):
    """Images (served by models with a vision tower) and documents (refused by the handler)."""

    type: Literal["image", "document"]
    source: dict[str, Any] | None = None


class ToolUseBlock(RequestModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[Union[TextBlock, MediaBlock], Field(discriminator="type")]] = ""
    is_error: bool | None = None


class ThinkingBlock(RequestModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(RequestModel):
    type: Literal["redacted_thinking"]
    data: str | None = None


ContentBlock = Annotated[
    Union[TextBlock, MediaBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock],
    Field(discriminator="type"),
]


class Message(RequestModel):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class MessagesRequest(RequestModel):
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: Count
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=INT32_MAX)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    priority: Priority = 0  # vLLM's, as on the OpenAI endpoints


class CountTokensRequest(RequestModel):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
