"""Sampling options, with the names and meaning of vLLM's SamplingParams."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from revolta import _core
from revolta.guided import GuidedDecodingParams, ReasoningGate


_INT32_MAX = 2**31 - 1  # the engine's integers


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # each prompt token's logprob (+ N alternatives); reads no prefix cache
    skip_special_tokens: bool = True
    return_generation_logits: bool = False
    guided_decoding: GuidedDecodingParams | dict | None = None  # constrained decoding (vLLM's name)
    guided_after: ReasoningGate | None = None  # the grammar starts after the model's reasoning
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100] (OpenAI's)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.guided_decoding is not None:
            self.guided_decoding = GuidedDecodingParams.of(self.guided_decoding)
        self.validate()

    def validate(self) -> None:
        """Raises ValueError naming the first invalid field. Here: what Python alone knows (n, stop
        strings) and that every value converts to the engine's types; the ranges are the engine's
        own check (SamplingParams::validate in C++), the one place both APIs go through."""

        def bad(name: str, rule: str) -> None:
            raise ValueError(f"{name} {rule}, got {getattr(self, name)!r}")

        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                bad(name, "must be a finite number")
        for name, low in (("top_k", -(2**31)), ("min_tokens", -(2**31))):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= _INT32_MAX:
                bad(name, "must be an integer")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or not -(2**31) <= self.max_tokens <= _INT32_MAX):
            bad("max_tokens", "must be an integer")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 20):
                bad(name, "must be an integer in [0, 20]")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**64):
            bad("seed", "must be an integer in [0, 2**64)")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", "must be non-empty strings")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= _INT32_MAX for t in self.stop_token_ids):
            bad("stop_token_ids", "must be token ids (integers in [0, 2**31))")
        bias = self.logit_bias or {}
        if not isinstance(bias, dict) or any(
                isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= _INT32_MAX or isinstance(b, bool)
                or not isinstance(b, (int, float)) or not -100 <= b <= 100 for t, b in bias.items()):
            bad("logit_bias", "must map token ids to biases in [-100, 100]")
        # The ranges, as the engine checks every request; min_tokens is unclamped here.
        self._core(self.max_tokens if self.max_tokens is not None else max(1, self.min_tokens)).validate()

    def to_core(self, max_tokens_cap: int, seed_offset: int = 0) -> _core.SamplingParams:
        p = self._core(self.max_tokens if self.max_tokens is not None else max_tokens_cap, seed_offset)
        p.min_tokens = int(min(self.min_tokens, p.max_tokens))
        return p

    def _core(self, max_tokens: int, seed_offset: int = 0) -> _core.SamplingParams:
        p = _core.SamplingParams()
        p.temperature = float(self.temperature)
        p.top_p = float(self.top_p)
        p.top_k = int(self.top_k)
        p.min_p = float(self.min_p)
        p.repetition_penalty = float(self.repetition_penalty)
        p.presence_penalty = float(self.presence_penalty)
        p.frequency_penalty = float(self.frequency_penalty)
        p.seed = None if self.seed is None else (self.seed + seed_offset) % 2**64
        p.max_tokens = int(max_tokens)
        p.min_tokens = int(self.min_tokens)
        p.ignore_eos = bool(self.ignore_eos)
        p.stop_token_ids = list(self.stop_token_ids)
        p.logprobs = -1 if self.logprobs is None else int(self.logprobs)
        p.prompt_logprobs = -1 if self.prompt_logprobs is None else int(self.prompt_logprobs)
        p.return_generation_logits = bool(self.return_generation_logits)
        if self.guided_decoding is not None:
            p.guided_kind, p.guided_data = self.guided_decoding.engine_form()
            if (g := self.guided_after) is not None:
                p.reasoning_start_token = -1 if g.start is None else int(g.start)
                p.reasoning_end_token = int(g.end)
                p.reasoning_answer_token = -1 if g.answer is None else int(g.answer)
                p.in_reasoning = bool(g.in_reasoning)
        p.logit_bias = [(int(t), float(b)) for t, b in (self.logit_bias or {}).items()]
        return p
