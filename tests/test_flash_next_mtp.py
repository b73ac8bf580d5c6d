"""Speculative decoding on Flash-Next (`qwen4_exp`), with its multi-token-prediction layer and with
n-gram drafts.

No implementation of Flash-Next's `mtp.*` block exists to check against (transformers, llama.cpp
and vLLM drop it); the engine takes it to be Qwen3.5's. The reference head is therefore made of
transformers' Qwen3.5-MoE decoder layer on the Flash-Next dimensions (tests/tiny_mtp.py), reading
Qwen4ExpForCausalLM's last hidden state (the final hyper-connection mix, which the LM head reads).
Drafts equal that head's; greedy output is token for token that of decoding without speculation
under concurrency, chunked prefill, prefix hits and preemption, which holds only if a rejected
draft's DeltaNet state, PLE n-gram window and PLE conv history are all rolled back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import tiny_mtp
from revolta import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import qwen4exp_reference as ref  # noqa: E402

CASE = "hc2-qsa4-ple"  # two streams, QSA ratio 4, PLE on a DeltaNet layer
PROMPTS = [ref.PROMPT, [(11 * i + 5) % 500 + 3 for i in range(70)], [9, 8, 7, 6, 5],
           [ref.EOS] * 3 + list(range(40, 57)), [31, 32, 33, 34] * 6, list(range(100, 112)) * 3]


@pytest.fixture(scope="module")
def flash_mtp(tmp_path_factory):
    d = tmp_path_factory.mktemp("flash_next_mtp")
    model = ref.make_checkpoint(CASE, d)
    head = tiny_mtp.add_random_mtp(model, d, seed=7, std=0.1, layer=tiny_mtp.qwen35_moe_layer(model.config))
    return str(d), model, head


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_checkpoint_carries_the_mtp_block(flash_mtp):
    d = Path(flash_mtp[0])
    assert json.loads((d / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    from safetensors import safe_open

    with safe_open(str(d / "mtp.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"mtp.fc.weight", "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.mlp.shared_expert_gate.weight"} <= names


def test_drafts_equal_the_reference_head(flash_mtp, monkeypatch):
    """Every draft kept (accept-drafts:1): the output alternates the MTP layer's draft and the
    target's token after it; each must be the reference's argmax (up to a near-tie)."""
    d, model, head = flash_mtp
    monkeypatch.setenv("REVOLTA_FAULT_INJECT", "accept-drafts:1")
    with LLM(d, kv_cache_memory_bytes=16 << 20, speculative_config={"method": "mtp", "num_speculative_tokens": 1}) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy(21))
        stats = llm.stats()
    assert stats.spec_num_drafts > 0 and stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
    checked = tiny_mtp.check_alternating_drafts(model, head, PROMPTS, [list(o.outputs[0].token_ids) for o in outs],
                                               ref.ties_to_lower_block)
    assert checked >= 50


def test_partly_kept_drafts_leave_the_state_of_the_kept_tokens(flash_mtp, monkeypatch):
    """Two of every three drafts kept (accept-drafts:2, whatever they are): each verify step rolls
    DeltaNet and PLE back and replays them through its input token and two drafts. Every third
    output token is then the target's, which must be transformers' argmax after the sequence as
    it stands, drafts included (or one past it, where the fault bumped a target token that equals
    the draft)."""
    d, model, _ = flash_mtp
    monkeypatch.setenv("REVOLTA_FAULT_INJECT", "accept-drafts:2")
    n = 31
    with LLM(d, kv_cache_memory_bytes=16 << 20, speculative_config={"method": "mtp", "num_speculative_tokens": 3}) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy(n))
        stats = llm.stats()
    assert list(stats.spec_accepted_per_position)[:2] == [stats.spec_num_drafts] * 2
    assert stats.spec_accepted_per_position[2] == 0
    checked = 0
    for prompt, o in zip(PROMPTS, outs):
        out = list(o.outputs[0].token_ids)
        seq = prompt + out
        with ref.ties_to_lower_block(), torch.no_grad():
            logits = model(torch.tensor([seq[:-1]])).logits[0]
        for j in range(0, n - 4, 3):  # the prefill's token, then each step's target token
            row = logits[len(prompt) + j - 1]
            best = int(row.argmax())
            assert out[j] in (best, (best + 1) % row.numel()), (j, out[j], best)
            if out[j] != best:
                continue
            checked += 1
    assert checked >= 40


SPECS = {"mtp": {"method": "mtp", "num_speculative_tokens": 3},
         "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}}


@pytest.mark.parametrize("engine", [
    dict(kv_cache_memory_bytes=16 << 20, enable_prefix_caching=True),
    dict(kv_cache_memory_bytes=16 << 20, max_num_batched_tokens=20),  # chunked prefill; drafts dropped for budget
    dict(kv_cache_memory_bytes=560 << 10, block_size=8, max_num_seqs=6, max_model_len=120),  # preemption
], ids=["plain", "chunked", "preemption"])
@pytest.mark.parametrize("method", list(SPECS))
def test_greedy_output_is_unchanged(flash_mtp, engine, method):
    d = flash_mtp[0]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    outs, stats = {}, {}
    for spec in (None, SPECS[method]):
        with LLM(d, speculative_config=spec, **engine) as llm:
            first = llm.generate(prompts, greedy(40))
            again = llm.generate(prompts, greedy(40))
            outs[bool(spec)] = [list(o.outputs[0].token_ids) for o in first + again]
            stats[bool(spec)] = llm.stats()
    assert outs[True] == outs[False]
    s = stats[True]
    assert s.spec_num_drafts > 0 and s.spec_num_accepted_tokens < s.spec_num_draft_tokens  # states rolled back
    if engine.get("enable_prefix_caching"):
        assert s.prefix_cache_hits > 0
    if "block_size" in engine:
        assert s.num_preemptions > 0
