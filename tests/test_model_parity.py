"""Every architecture against HF transformers on tiny random configs: logits, greedy decoding, and
the same greedy output under concurrency, prefix-cache hits, chunked prefill and preemption.

Dense: Llama, Qwen3. MoE / hybrid: Qwen3-MoE, Qwen3-Next, Qwen3.5-MoE (text), whose prompts run
longer than one Gated DeltaNet chunk (64 tokens) and end off block boundaries."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import hf_greedy, hf_last_logits, kv_bytes_per_token, make_hf_model, state_bytes_per_slot
from revolta import LLM, SamplingParams

CONFIGS = {
    "llama-gqa2-untied": ("llama", dict(num_attention_heads=4, num_key_value_heads=2)),
    "llama-mha-tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)),
    "llama-gqa4-llama3rope": (
        "llama",
        dict(
            num_attention_heads=8,
            num_key_value_heads=2,
            hidden_size=128,
            rope_parameters=dict(
                rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=64,
            ),
        ),
    ),
    "llama-mqa-yarn": (
        "llama",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64),
        ),
    ),
    "qwen3-gqa2-tied": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3-gqa3-headdim32": (
        "qwen3",
        dict(num_attention_heads=6, num_key_value_heads=2, head_dim=32, num_hidden_layers=3, tie_word_embeddings=False),
    ),
    "qwen3_moe-4x2": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False)),
    "qwen3_moe-8x3-sparse-step": (
        "qwen3_moe",
        dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=24, num_attention_heads=8, num_key_value_heads=2,
             head_dim=16, num_hidden_layers=3, decoder_sparse_step=2, mlp_only_layers=[0], norm_topk_prob=True),
    ),
    "qwen3_next-interval4": (
        "qwen3_next",
        dict(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, head_dim=16),
    ),
    "qwen3_next-alternating": (
        "qwen3_next",
        dict(num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"],
             num_attention_heads=6, num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=3,
             moe_intermediate_size=24, shared_expert_intermediate_size=32, linear_num_key_heads=1, linear_num_value_heads=2,
             linear_key_head_dim=32, linear_value_head_dim=16, tie_word_embeddings=True),
    ),
    "qwen3_5_moe-interval4": (
        "qwen3_5_moe",
        dict(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, head_dim=16),
    ),
    "qwen3_5_moe-mqa": (
        "qwen3_5_moe",
        dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], num_attention_heads=4, num_key_value_heads=1,
             head_dim=32, num_experts=5, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
             linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=24, linear_value_head_dim=32),
    ),
}

PROMPT_LENGTHS = [5, 17, 70, 101]  # shorter and longer than one DeltaNet chunk; off block boundaries
GEN = 32


def make_prompts(seed: int, vocab: int = 256) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module", params=list(CONFIGS))
def case(request, tmp_path_factory):
    kind, overrides = CONFIGS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    model = make_hf_model(kind, path, seed=len(request.param), **overrides)
    prompts = make_prompts(seed=len(request.param))
    expected = [hf_greedy(model, p, GEN) for p in prompts]
    return model, str(path), prompts, expected


def greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=GEN, ignore_eos=True, **kw)


def run(llm: LLM, prompts, **kw) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(**kw))]


def test_logits_match_hf(case):
    model, path, prompts, _ = case
    with LLM(path, kv_cache_memory_bytes=8 << 20) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, return_generation_logits=True))
    for prompt, out in zip(prompts, outs):
        ours = torch.tensor(out.outputs[0].generation_logits[0])
        ref = hf_last_logits(model, prompt)
        assert ours.shape == ref.shape
        err = (ours - ref).abs().max().item()
        assert err < 1e-4, f"prompt of {len(prompt)} tokens: max |logit diff| {err}"


def test_greedy_concurrent_and_prefix_cache(case):
    _, path, prompts, expected = case
    with LLM(path, kv_cache_memory_bytes=8 << 20, enable_prefix_caching=True) as llm:
        assert run(llm, prompts) == expected
        hits_before = llm.stats().prefix_cache_hits
        # Same prompts again: every full block of each prompt is now in the cache.
        assert run(llm, prompts) == expected
        stats = llm.stats()
        assert stats.prefix_cache_hits > hits_before
        assert stats.num_blocks_used == 0  # everything released after the requests finished
        # Logits after a prefix hit (restored KV, and for hybrid models a restored state snapshot).
        hits_before = stats.prefix_cache_hits
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, return_generation_logits=True))
        assert llm.stats().prefix_cache_hits > hits_before
        for prompt, out in zip(prompts, outs):
            ours = torch.tensor(out.outputs[0].generation_logits[0])
            assert (ours - hf_last_logits(case[0], prompt)).abs().max().item() < 1e-4


def test_greedy_single_request(case):
    """Decode steps of one token: MoE layers take the per-token expert path (ops::moe_experts)."""
    _, path, prompts, expected = case
    with LLM(path, kv_cache_memory_bytes=8 << 20) as llm:
        assert run(llm, prompts[-1:]) == expected[-1:]


def test_decode_step_logits_match_hf(case):
    """Logits of decode steps of one token (hybrid models leave the DeltaNet's gated norm to the
    output projection there: ops::linear_scaled) against HF's over the same tokens."""
    model, path, prompts, _ = case
    prompt = prompts[1]
    with LLM(path, kv_cache_memory_bytes=8 << 20) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, return_generation_logits=True)
        out = llm.generate([prompt], params)[0].outputs[0]
    assert len(out.generation_logits) == 4
    for i in range(1, 4):  # step i's logits follow the prompt and the first i generated tokens
        ours = torch.tensor(out.generation_logits[i])
        err = (ours - hf_last_logits(model, prompt + list(out.token_ids[:i]))).abs().max().item()
        assert err < 1e-4, f"decode step {i}: max |logit diff| {err}"


def test_greedy_chunked_prefill(case):
    _, path, prompts, expected = case
    for budget in (7, 16, 40):  # 40: chunks that split a 64-token DeltaNet chunk off block boundaries
        with LLM(path, kv_cache_memory_bytes=8 << 20, max_num_batched_tokens=budget) as llm:
            assert run(llm, prompts) == expected, f"max_num_batched_tokens={budget}"


def test_greedy_under_preemption(case):
    model, path, prompts, expected = case
    max_len = max(PROMPT_LENGTHS) + GEN + 1
    block, seqs = 16, 4
    blocks = -(-max_len // block) + 1  # room for one longest request, not for all four
    states = 2 * seqs * state_bytes_per_slot(model)  # running slots + prefix snapshots
    with LLM(
        path,
        max_model_len=max_len,
        block_size=block,
        max_num_seqs=seqs,
        kv_cache_memory_bytes=blocks * block * kv_bytes_per_token(model) + states,
    ) as llm:
        assert run(llm, prompts) == expected
        assert llm.stats().num_preemptions > 0


def test_greedy_with_async_scheduling(case):
    """Decode steps queued before the host has read the previous step's tokens (fed on the device;
    the CPU runs the same bookkeeping): the same tokens, lengths and stops as the plain loop, the
    step queued past a stop token discarded without a trace, prefix-cache hits, and preemption."""
    model, path, prompts, expected = case
    stop = expected[0][10]
    params = [
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=GEN, ignore_eos=True, stop_token_ids=[stop]),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
    ]
    varied = [prompts[1], prompts[0], prompts[3], prompts[2]]
    with LLM(path, kv_cache_memory_bytes=8 << 20, async_scheduling="on") as llm:
        assert run(llm, prompts) == expected
        ahead = llm.stats().steps_run_ahead
        assert ahead > 0
        outs = llm.generate(varied, params)
        assert llm.stats().steps_run_ahead > ahead
        hits_before = llm.stats().prefix_cache_hits
        assert run(llm, prompts) == expected  # now from the prefix cache
        stats = llm.stats()
        assert stats.prefix_cache_hits > hits_before
        assert stats.num_blocks_used == 0
    got = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs]
    cut = expected[0].index(stop) + 1
    assert got == [
        (expected[1][:3], "length"),
        (expected[0][:cut], "stop"),
        (expected[3][:9], "length"),
        (expected[2][:20], "length"),
    ]
    with LLM(path, kv_cache_memory_bytes=8 << 20, async_scheduling="off") as llm:
        assert [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(varied, params)] == got
        assert llm.stats().steps_run_ahead == 0

    max_len = max(PROMPT_LENGTHS) + GEN + 1
    block, seqs = 16, 4
    blocks = -(-max_len // block) + 1
    with LLM(path, max_model_len=max_len, block_size=block, max_num_seqs=seqs, async_scheduling="on",
             kv_cache_memory_bytes=blocks * block * kv_bytes_per_token(model) + 2 * seqs * state_bytes_per_slot(model)) as llm:
        assert run(llm, prompts) == expected
        stats = llm.stats()
        assert stats.num_preemptions > 0 and stats.steps_run_ahead > 0
