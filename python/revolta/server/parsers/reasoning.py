"""Reasoning split by token id: `<think> ... </think>` (Qwen3 family).

The router sees each generated token id and says which channel it belongs to; marker tokens are
dropped. Text is never searched, so a `</think>` spelled inside the reasoning cannot end it, and
token boundaries cannot split a marker.
"""

from __future__ import annotations

from dataclasses import dataclass

REASONING = "reasoning"
CONTENT = "content"


@dataclass
class ReasoningTokens:
    start: int  # <think>
    end: int  # </think>
    tool_call: int | None = None  # <tool_call>: ends reasoning if it appears before </think>


class ReasoningRouter:
    def __init__(self, tokens: ReasoningTokens, starts_in_reasoning: bool, enabled: bool = True):
        self.tokens = tokens
        self.enabled = enabled
        self.in_reasoning = enabled and starts_in_reasoning
        self.seen_content = False
        self.reasoning_ended = False  # a </think> (or <tool_call>) closed a reasoning block

    def route(self, token: int) -> str | None:
        """The channel of this token, or None for a marker token that belongs to no channel."""
        if not self.enabled:
            return CONTENT
        t = self.tokens
        if self.in_reasoning:
            if token == t.end:
                self.in_reasoning, self.reasoning_ended = False, True
                return None
            if t.tool_call is not None and token == t.tool_call:
                self.in_reasoning, self.reasoning_ended = False, True
                return CONTENT
            return REASONING
        if token == t.start and not self.seen_content and not self.reasoning_ended:
            self.in_reasoning = True  # the model opened the block itself
            return None
        self.seen_content = True
        return CONTENT


def qwen3_reasoning_tokens(tokenizer) -> ReasoningTokens | None:
    start, end = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
    if start is None or end is None:
        return None
    return ReasoningTokens(start=start, end=end, tool_call=tokenizer.token_to_id("<tool_call>"))


def prompt_opens_reasoning(prompt_ids: list[int], tokens: ReasoningTokens) -> bool:
    """True when the chat template itself ended the prompt inside an open <think> block."""
    for t in reversed(prompt_ids):
        if t == tokens.end:
            return False
        if t == tokens.start:
            return True
    return False
