"""One engine request as the server follows it: token ids in, channel text deltas out.

Reasoning is split from content by token id (parsers/reasoning.py); each channel has its own
incremental detokenizer. Stop strings are matched only in content, i.e. after reasoning ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from revolta import _core
from revolta.models.tokenizer import IncrementalDetokenizer, Tokenizer
from revolta.stop_strings import StopStrings
from revolta.server.parsers.reasoning import CONTENT, REASONING, ReasoningRouter


@dataclass
class TokenInfo:
    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Delta:
    content: str = ""
    reasoning: str = ""
    tokens: list[TokenInfo] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    tool_calls: list = field(default_factory=list)  # ToolCallDelta, filled by the chat handler


class Generation:
    def __init__(
        self,
        tokenizer: Tokenizer,
        stop: list[str],
        include_stop_str: bool,
        skip_special_tokens: bool,
        router: ReasoningRouter | None,
        stop_token_ids: list[int] | None = None,
    ):
        self.stops = StopStrings(stop, include_stop_str)
        self.stop_token_ids = set(stop_token_ids or [])  # EOS is not a stop_reason (vLLM's null)
        self.router = router
        self.content_detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self.reasoning_detok = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self.content = ""
        self.emitted = 0  # length of content already handed out
        self.reasoning = ""
        self.num_tokens = 0
        self.num_reasoning_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    @property
    def stopped_by_string(self) -> bool:
        return self.finish_reason == "stop" and isinstance(self.stop_reason, str)

    def feed(self, out: _core.RequestOutput) -> Delta:
        delta = Delta()
        for t in out.tokens:
            if self.finish_reason is not None:
                break
            self.num_tokens += 1
            delta.tokens.append(TokenInfo(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]))
            channel = self.router.route(t.token) if self.router else CONTENT
            if channel == REASONING:
                self.num_reasoning_tokens += 1
                piece = self.reasoning_detok.add([t.token])
                self.reasoning += piece
                delta.reasoning += piece
            elif channel == CONTENT:
                before = len(self.content)
                self.content += self.content_detok.add([t.token])
                found = self.stops.find(self.content, before)
                if found is not None:
                    self.content = self.content[:found[0]]
                    self.finish_reason, self.stop_reason = "stop", found[1]
        # Content that could still be the start of a stop string is held back until it is not.
        final = self.finish_reason is not None or out.finished
        safe = len(self.content) if final else len(self.content) - self.stops.partial_len(self.content)
        if safe > self.emitted:
            delta.content = self.content[self.emitted:safe]
            self.emitted = safe
        if self.finish_reason is None and out.finished:
            self.finish_reason = out.finish_reason
            if out.finish_reason == "stop" and out.stop_token_id in self.stop_token_ids:
                self.stop_reason = out.stop_token_id
        delta.finish_reason = self.finish_reason
        delta.stop_reason = self.stop_reason
        return delta
