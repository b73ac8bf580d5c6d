"""Beam search (vLLM's BeamSearchParams; HF transformers' algorithm and scores), driven from the
front: each step asks the engine for every running beam's top next tokens (one greedy token with
logprobs; the prefix cache holds the shared prefix), so it needs no engine support of its own.

As transformers does it: each step keeps the 2 x beam_width best continuations of all beams by
summed log-probability; those among the best beam_width that end (an EOS token, or the last
allowed token) become finished hypotheses scored sum / length ** length_penalty; the best
beam_width unfinished ones run on. The search stops when no running beam can beat the worst of
beam_width finished hypotheses (transformers' early_stopping=False heuristic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator

from revolta import _core

MAX_BEAM_WIDTH = 10  # 2 x beam_width alternatives per step, and the engine returns at most 20


@dataclass
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # only 0: the beams follow the model's own log-probabilities
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False  # (no stop strings here; vLLM's field, kept for its callers)

    def __post_init__(self) -> None:
        if isinstance(self.beam_width, bool) or not isinstance(self.beam_width, int) or not 1 <= self.beam_width <= MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width must be an integer in [1, {MAX_BEAM_WIDTH}], got {self.beam_width!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature != 0:
            raise ValueError(f"temperature must be 0 for beam search, got {self.temperature!r}")
        if not -10 <= self.length_penalty <= 10:
            raise ValueError(f"length_penalty must be in [-10, 10], got {self.length_penalty!r}")


@dataclass
class BeamSearchSequence:
    """One finished beam: tokens are the prompt's followed by the generated ones (as vLLM has it)."""

    tokens: list[int]
    logprobs: list[float]  # each generated token's log-probability
    cum_logprob: float
    score: float  # cum_logprob / len(generated) ** length_penalty: the order of the sequences
    text: str | None = None
    finish_reason: str = "length"


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence] = field(default_factory=list)


Expansion = list[list[tuple[int, float]]]  # per expanded sequence: its best next tokens and their log-probabilities


def search(prompt: list[int], params: BeamSearchParams, eos: set[int]) -> Generator[list[list[int]], Expansion, list[BeamSearchSequence]]:
    """Yields the sequences (prompt + tokens) whose next-token alternatives it needs, receives them
    (2 x beam_width each, best first), returns the finished beams, best first."""
    k = params.beam_width
    running: list[tuple[float, list[int], list[float]]] = [(0.0, [], [])]
    finished: list[BeamSearchSequence] = []
    improvable = True
    for step in range(params.max_tokens):
        alternatives = yield [prompt + toks for _, toks, _ in running]
        candidates = [(total + lp, toks + [t], lps + [lp])
                      for (total, toks, lps), alts in zip(running, alternatives) for t, lp in alts[:2 * k]]
        candidates.sort(key=lambda c: -c[0])  # stable: ties keep beam order, then token order
        candidates = candidates[:2 * k]
        last = step + 1 == params.max_tokens
        ends = [last or (not params.ignore_eos and c[1][-1] in eos) for c in candidates]
        if improvable:
            for rank, (c, end) in enumerate(zip(candidates, ends)):
                if end and rank < k:
                    n = len(c[1])
                    finished.append(BeamSearchSequence(tokens=prompt + c[1], logprobs=c[2], cum_logprob=c[0],
                                                       score=c[0] / n ** params.length_penalty,
                                                       finish_reason="length" if c[1][-1] not in eos or params.ignore_eos else "stop"))
            finished.sort(key=lambda s: -s.score)
            del finished[k:]
        running = [c for c, end in zip(candidates, ends) if not end][:k]
        if not running:
            break
        # transformers' early_stopping=False heuristic: the best running beam at its current length
        best_running = running[0][0] / (step + 1) ** params.length_penalty
        improvable = improvable and (len(finished) < k or best_running > finished[-1].score)
        if not improvable:
            break
    return finished


class Lockstep:
    """Several prompts' searches expanded together: pending() is every open search's sequences,
    feed() takes their expansions in that order."""

    def __init__(self, prompts: list[list[int]], params: BeamSearchParams, eos: set[int]):
        self.searches = [search(ids, params, eos) for ids in prompts]
        self.wanted = [next(s) for s in self.searches]
        self.results: list[list[BeamSearchSequence] | None] = [None] * len(prompts)

    @property
    def done(self) -> bool:
        return all(r is not None for r in self.results)

    def pending(self) -> list[list[int]]:
        return [seq for i, r in enumerate(self.results) if r is None for seq in self.wanted[i]]

    def feed(self, expansions: Expansion) -> None:
        it = iter(expansions)
        for i, r in enumerate(self.results):
            if r is not None:
                continue
            try:
                self.wanted[i] = self.searches[i].send([next(it) for _ in self.wanted[i]])
            except StopIteration as finished:
                self.results[i] = finished.value


async def run_async(engine, prompts: list[list[int]], params: BeamSearchParams, eos: set[int]) -> list[list[BeamSearchSequence]]:
    """The searches over the server's AsyncEngine (its requests aborted if the caller goes away)."""
    steps = Lockstep(prompts, params, eos)
    while not steps.done:
        added = [engine.add_request(seq, step_params(params.beam_width)) for seq in steps.pending()]
        try:
            expansions = []
            for _, q in added:
                out = await q.get()
                if not getattr(out, "tokens", None):  # a Failure (the engine died or shut down)
                    raise RuntimeError(getattr(out, "message", "the engine returned no token"))
                expansions.append(top_alternatives(out.tokens))
        except BaseException:
            for rid, _ in added:
                engine.abort(rid)
            raise
        steps.feed(expansions)
    return steps.results


def top_alternatives(out_tokens) -> list[tuple[int, float]]:
    """An engine output's first token with its alternatives, best first."""
    t = out_tokens[0]
    alts = {a.token: a.logprob for a in t.top_logprobs}
    alts.setdefault(t.token, t.logprob)
    return sorted(alts.items(), key=lambda a: (-a[1], a[0]))


def step_params(width: int) -> _core.SamplingParams:
    """The engine request of one expansion: one greedy token and its 2 x width alternatives."""
    p = _core.SamplingParams()
    p.temperature = 0.0
    p.max_tokens = 1
    p.ignore_eos = True
    p.logprobs = 2 * width
    return p
