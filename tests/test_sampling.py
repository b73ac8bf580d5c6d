"""Sampling against references: HF transformers' logits processors for the distribution and the
penalties, torch's log_softmax for logprobs; plus seeds, stop tokens, min_tokens and abort."""

from __future__ import annotations

import collections
import time

import pytest
import torch

from conftest import hf_greedy, make_hf_model
from revolta import LLM, SamplingParams, _core

PROMPT = [17, 4, 99, 23, 150, 8, 61, 200, 33]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("sampling")
    model = make_hf_model("llama", path, seed=11, initializer_range=0.2)
    llm = LLM(str(path), kv_cache_memory_bytes=16 << 20, max_num_seqs=128)
    yield model, llm
    llm.shutdown()


def test_seeded_sampling_is_reproducible(setup):
    _, llm = setup
    p = SamplingParams(temperature=1.0, max_tokens=16, seed=1234, ignore_eos=True)
    a = llm.generate([PROMPT], p)[0].outputs[0].token_ids
    b = llm.generate([PROMPT], p)[0].outputs[0].token_ids
    c = llm.generate([PROMPT], SamplingParams(temperature=1.0, max_tokens=16, seed=4321, ignore_eos=True))[0].outputs[0].token_ids
    assert a == b
    assert a != c
    two = llm.generate([PROMPT], SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=7, ignore_eos=True))[0]
    assert len(two.outputs) == 2 and two.outputs[0].token_ids != two.outputs[1].token_ids


def test_top_k_one_is_greedy(setup):
    model, llm = setup
    out = llm.generate([PROMPT], SamplingParams(temperature=0.8, top_k=1, max_tokens=10, ignore_eos=True, seed=3))
    assert out[0].outputs[0].token_ids == hf_greedy(model, PROMPT, 10)


def test_logprobs_match_torch(setup):
    model, llm = setup
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=1, logprobs=5))[0].outputs[0]
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0, -1].double(), dim=-1)
    entry = out.logprobs[0]
    tok = out.token_ids[0]
    assert abs(entry[tok] - ref[tok].item()) < 1e-4
    top = torch.topk(ref, 5)
    assert set(entry) == set(top.indices.tolist())  # the greedy token is among the top 5
    for t, lp in zip(top.indices.tolist(), top.values.tolist()):
        assert abs(entry[t] - lp) < 1e-4
    assert abs(out.cumulative_logprob - entry[tok]) < 1e-6


def test_sampling_distribution_matches_hf_warpers(setup):
    from transformers.generation.logits_process import (
        LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
    )

    model, llm = setup
    temperature, top_k, top_p, min_p = 0.7, 12, 0.85, 0.05
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0, -1:].float()
    warpers = LogitsProcessorList([
        TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k), TopPLogitsWarper(top_p), MinPLogitsWarper(min_p),
    ])
    expected = torch.softmax(warpers(torch.tensor([PROMPT]), logits)[0], dim=-1)
    support = set(torch.nonzero(expected > 0).flatten().tolist())
    assert 2 < len(support) < top_k  # the cut-offs really act here

    n = 1500
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, max_tokens=1, seed=s) for s in range(n)]
    outs = llm.generate([PROMPT] * n, params)
    counts = collections.Counter(o.outputs[0].token_ids[0] for o in outs)
    assert set(counts) <= support
    tv = 0.5 * sum(abs(counts.get(t, 0) / n - expected[t].item()) for t in support)
    assert tv < 0.06, f"total variation {tv:.3f} between sampled and expected distributions"


def test_repetition_penalty_matches_hf(setup):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    model, llm = setup
    proc = RepetitionPenaltyLogitsProcessor(0.5)
    # A penalty below 1 favours tokens already seen, so it is sure to change the greedy path.
    prompt = PROMPT + hf_greedy(model, PROMPT, 12)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            logits = model(torch.tensor([seq])).logits[0, -1:]
            seq.append(int(torch.argmax(proc(torch.tensor([seq]), logits)[0])))
    expected = seq[len(prompt):]
    ours = llm.generate([prompt], SamplingParams(temperature=0.0, repetition_penalty=0.5, max_tokens=12, ignore_eos=True))
    assert ours[0].outputs[0].token_ids == expected
    assert expected != hf_greedy(model, prompt, 12)  # the penalty changed something


def test_frequency_and_presence_penalties(setup):
    model, llm = setup
    freq, pres = 0.9, 0.4
    seq = list(PROMPT)
    with torch.no_grad():
        for _ in range(12):
            logits = model(torch.tensor([seq])).logits[0, -1].clone()
            for t, c in collections.Counter(seq[len(PROMPT):]).items():  # OpenAI's definition
                logits[t] -= freq * c + pres
            seq.append(int(torch.argmax(logits)))
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, frequency_penalty=freq, presence_penalty=pres, max_tokens=12, ignore_eos=True))
    assert out[0].outputs[0].token_ids == seq[len(PROMPT):]


def test_stop_token_ids_and_min_tokens(setup):
    model, llm = setup
    expected = hf_greedy(model, PROMPT, 12)
    stop = next(t for i, t in enumerate(expected) if i >= 3 and t not in expected[:i])
    k = expected.index(stop)
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop]))[0].outputs[0]
    assert out.token_ids == expected[: k + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    # min_tokens masks the stop token until k + 2 tokens exist.
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12, min_tokens=k + 2, stop_token_ids=[stop]))[0].outputs[0]
    assert stop not in out.token_ids[: k + 2]
    assert len(out.token_ids) >= k + 2
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5


def test_abort_frees_blocks(setup):
    _, llm = setup
    p = _core.SamplingParams()
    p.max_tokens = 10_000 // 2
    p.ignore_eos = True
    # Neighbours in the same steps keep each step long enough that the abort lands mid-generation.
    others = [llm.engine.add_request(PROMPT * 2, p) for _ in range(48)]
    rid = llm.engine.add_request(PROMPT * 3, p)
    seen, reason = 0, None
    deadline = time.time() + 30
    while reason is None and time.time() < deadline:
        for o in llm.engine.await_outputs(0.1):
            if o.request_id != rid:
                continue
            seen += len(o.tokens)
            if seen >= 3 and not o.finished:
                llm.engine.abort(rid)
            if o.finished:
                reason = o.finish_reason
    for other in others:
        llm.engine.abort(other)
    assert reason == "abort"
    while llm.stats().num_running or llm.stats().num_waiting:
        assert time.time() < deadline
        llm.engine.await_outputs(0.05)
    assert llm.stats().num_blocks_used == 0
    assert llm.stats().num_running == 0
