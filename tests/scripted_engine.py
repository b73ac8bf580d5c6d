"""A stand-in for AsyncEngine that "generates" a scripted token sequence, for protocol tests."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace


class ScriptedEngine:
    """Stands in for AsyncEngine: every request 'generates' the scripted token ids, a few at a time."""

    def __init__(self, script: list[int], eos: int):
        self.script, self.eos = script, eos
        self.model_info = SimpleNamespace(max_model_len=4096, vocab_size=60000)
        self.max_num_seqs = 64
        self.dead = None
        self.prompts: list[list[int]] = []
        self.params: list = []  # the engine SamplingParams of each request
        self.aborted: list[int] = []

    def add_request(self, prompt_ids, params, tag=None, media=None):
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        q: asyncio.Queue = asyncio.Queue()
        ids = self.script[: params.max_tokens]
        for i in range(0, len(ids), 3):
            chunk = ids[i:i + 3]
            last = i + 3 >= len(ids)
            stop = last and chunk[-1] == self.eos
            q.put_nowait(SimpleNamespace(
                tokens=[SimpleNamespace(token=t, logprob=-0.5, top_logprobs=[]) for t in chunk],
                finished=last, finish_reason=("stop" if stop else "length") if last else "none",
                stop_token_id=chunk[-1] if stop else -1, num_cached_tokens=0, prompt_logprobs=[]))
        return len(self.prompts), q

    def abort(self, rid):
        self.aborted.append(rid)

    def stats(self):
        return SimpleNamespace(num_running=0, num_waiting=0, num_blocks_used=0, num_blocks_total=1,
                               prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0, spec_num_drafts=0,
                               spec_num_draft_tokens=0, spec_num_accepted_tokens=0, spec_accepted_per_position=[])
