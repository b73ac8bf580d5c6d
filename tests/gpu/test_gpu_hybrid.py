"""The hybrid / MoE family (Qwen3-Next, Qwen3.5-MoE text) on the GPU against the CPU engine
(`pytest -m gpu`): Gated DeltaNet layers with their recurrent state on the device, gated
attention, routed experts and the shared expert.

Greedy output must match token for token except where the CPU engine itself was at a near-tie
(the rule of test_gpu_engine.py): a divergence at token i is allowed only when the CPU's top-2
logits at i differ by less than NEAR_TIE. The GPU runs fp16 weights and KV with an fp32 state."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from conftest import assert_greedy_until_near_tie, greedy, make_hf_model

pytestmark = pytest.mark.gpu

NEAR_TIE = 0.03  # logits units
GEN = 24

SMALL = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
             head_dim=16)
CONFIGS = {
    "qwen3_next-interval4": ("qwen3_next", dict(num_hidden_layers=4, **SMALL)),
    "qwen3_5_moe-interval4": ("qwen3_5_moe", dict(num_hidden_layers=4, **SMALL)),
    "qwen3_next-alternating-tied": (
        "qwen3_next",
        dict(num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"],
             num_attention_heads=6, num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=3,
             moe_intermediate_size=24, shared_expert_intermediate_size=32, linear_num_key_heads=1,
             linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=16, tie_word_embeddings=True),
    ),
    # The real model's per-head dimensions (attention head 256 with a quarter rotary, DeltaNet
    # heads 128 x 128, two value heads per key head) on a narrow, shallow model.
    "qwen3_next-real-head-dims": (
        "qwen3_next",
        dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
             num_experts=16, num_experts_per_tok=4, moe_intermediate_size=64, shared_expert_intermediate_size=64,
             linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128),
    ),
}
PROMPT_LENGTHS = (5, 17, 70, 101, 300, 9, 33, 2)  # around the 64-token DeltaNet chunk and block edges


def prompts(n):
    rng = np.random.default_rng(11)
    return [{"prompt_token_ids": rng.integers(3, 256, size=PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)]).tolist()}
            for i in range(n)]


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    import revolta

    kind, overrides = CONFIGS[request.param]
    d = tmp_path_factory.mktemp(request.param)
    make_hf_model(kind, d, seed=5, max_position_embeddings=1024, **overrides)
    common = dict(max_model_len=1024, kv_cache_memory_bytes=64 << 20, enable_prefix_caching=True, max_num_seqs=16)
    cpu = revolta.LLM(str(d), dtype="float32", **common)
    gpu = revolta.LLM(str(d), device="cuda", gpu_memory_utilization=0.0, **common)
    yield cpu, gpu
    cpu.engine.shutdown()
    gpu.engine.shutdown()
    del cpu, gpu
    gc.collect()


def sampling(logits=False):
    return greedy(GEN, logits)


def assert_greedy_match(cpu_out, gpu_out):
    assert_greedy_until_near_tie(cpu_out, gpu_out, NEAR_TIE, GEN)


def test_greedy_matches_cpu(pair):
    cpu, gpu = pair
    for p in prompts(5):
        c, g = cpu.generate([p], sampling(True))[0], gpu.generate([p], sampling(True))[0]
        assert_greedy_match(c, g)
        lc, lg = np.asarray(c.outputs[0].generation_logits[0]), np.asarray(g.outputs[0].generation_logits[0])
        assert np.max(np.abs(lc - lg)) < 1e-2 * (1 + np.max(np.abs(lc))), np.max(np.abs(lc - lg))


def test_eight_concurrent_requests_and_decode_graphs(pair):
    cpu, gpu = pair
    ps = prompts(8)
    before = gpu.engine.stats().graph_replays
    batch = gpu.generate(ps, sampling())  # one batch: decode rows next to prefill chunks
    # Pure decode steps replay graphs: DeltaNet states by slot, experts picked on the device.
    assert gpu.engine.stats().graph_replays > before
    for p, g in zip(ps, batch):
        assert_greedy_match(cpu.generate([p], sampling(True))[0], g)


def test_prefix_cache_hit_restores_the_state(pair):
    """A second request with the same 300-token prompt restores KV blocks and a DeltaNet state
    snapshot on the device and continues exactly as the first did."""
    cpu, gpu = pair
    p = prompts(5)[4]
    first = gpu.generate([p], sampling(True))[0]
    hits = gpu.engine.stats().prefix_cache_hits
    second = gpu.generate([p], sampling(True))[0]
    assert gpu.engine.stats().prefix_cache_hits > hits
    assert second.num_cached_tokens >= 256
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    assert_greedy_match(cpu.generate([p], sampling(True))[0], second)


def test_ngram_speculation_rolls_the_state_back(pair, tmp_path):
    """Drafts verified on the device for a Gated DeltaNet model (a verify step runs k + 1 tokens of
    a sequence through the DeltaNet kernels; a rejection restores the state saved before it):
    greedy output equal to the CPU engine's without speculation, up to a CPU near-tie."""
    import revolta

    cpu, gpu_plain = pair
    rng = np.random.default_rng(5)
    ps = [{"prompt_token_ids": (rng.integers(3, 256, size=n).tolist()) * 3} for n in (5, 11, 30)]
    spec = revolta.LLM(gpu_plain.model_path, device="cuda", gpu_memory_utilization=0.0, max_model_len=1024,
                       kv_cache_memory_bytes=64 << 20, max_num_seqs=16,
                       speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    try:
        outs = spec.generate(ps, sampling())
        for p, g in zip(ps, outs):
            assert_greedy_match(cpu.generate([p], sampling(True))[0], g)
        s = spec.stats()
        assert s.spec_num_draft_tokens > 0 and s.num_blocks_used == 0
    finally:
        spec.shutdown()


def test_mtp_speculation_on_the_device(tmp_path):
    """The MTP drafter on the device (its layer, its K/V, verification of its drafts in recorded
    graphs): greedy output with k = 3 equal to the CPU engine's without speculation, up to a CPU
    near-tie, and with every draft kept (accept-drafts:1) the drafts equal the CPU engine's."""
    import os

    import revolta
    import tiny_mtp

    model = make_hf_model("qwen3_next", tmp_path, seed=5, max_position_embeddings=1024, num_hidden_layers=4, **SMALL)
    tiny_mtp.add_random_mtp(model, tmp_path, seed=6)
    common = dict(max_model_len=1024, kv_cache_memory_bytes=64 << 20, max_num_seqs=16)
    mtp = {"method": "mtp", "num_speculative_tokens": 3}
    ps = prompts(6)
    with revolta.LLM(str(tmp_path), dtype="float32", **common) as cpu:
        ref = [cpu.generate([p], sampling(True))[0] for p in ps]
    with revolta.LLM(str(tmp_path), device="cuda", gpu_memory_utilization=0.0, speculative_config=mtp, **common) as gpu:
        for c, g in zip(ref, gpu.generate(ps, sampling())):
            assert_greedy_match(c, g)
        assert gpu.stats().spec_num_drafts > 0
        assert gpu.stats().graph_replays > 0  # verify steps of k + 1 tokens per sequence replay graphs
    os.environ["REVOLTA_FAULT_INJECT"] = "accept-drafts:1"
    try:
        forced = {}
        for device in ("cpu", "cuda"):
            opts = dict(device="cuda", gpu_memory_utilization=0.0) if device == "cuda" else dict(dtype="float32")
            with revolta.LLM(str(tmp_path), speculative_config=mtp | {"num_speculative_tokens": 1}, **opts, **common) as llm:
                forced[device] = [o.outputs[0].token_ids for o in llm.generate(ps, sampling())]
    finally:
        del os.environ["REVOLTA_FAULT_INJECT"]
    same = sum(a == b for c, g in zip(forced["cpu"], forced["cuda"]) for a, b in zip(c, g))
    assert same >= 0.9 * sum(len(c) for c in forced["cpu"])  # divergences only after near-ties


def test_trained_mtp_head_accepts_as_on_the_cpu():
    """The Shakespeare-trained tiny model (tests/tiny_mtp.py, from REVOLTA_TEST_CACHE) on the
    device: acceptance per draft position within 0.05 of the CPU engine's."""
    import revolta
    import test_mtp
    import tiny_mtp

    d = test_mtp.trained_dir()
    held_out = [{"prompt_token_ids": p} for p in __import__("json").loads((d / "prompts.json").read_text())]
    params = revolta.SamplingParams(temperature=0.0, max_tokens=tiny_mtp.ACCEPTANCE_TOKENS, ignore_eos=True)
    spec = {"method": "mtp", "num_speculative_tokens": tiny_mtp.ACCEPTANCE_K}
    rates = {}
    for device in ("cpu", "cuda"):
        opts = dict(device="cuda", gpu_memory_utilization=0.0) if device == "cuda" else {}
        with revolta.LLM(str(d), max_model_len=512, kv_cache_memory_bytes=64 << 20, speculative_config=spec, **opts) as llm:
            llm.generate(held_out, params)
            s = llm.stats()
        rates[device] = [a / s.spec_num_drafts for a in s.spec_accepted_per_position]
    print(f"trained MTP acceptance per position: cpu {rates['cpu']}, cuda {rates['cuda']}")
    assert all(abs(a - b) <= 0.05 for a, b in zip(rates["cpu"], rates["cuda"]))
