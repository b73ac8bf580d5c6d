"""Tensor parallelism on the CPU (ranks as threads of the engine's process): the sharded model gives
the greedy tokens of the unsharded one, which HF transformers confirms, with its logits within a
float32 rounding tolerance, under concurrency, prefix-cache hits and preemption, for every
architecture (dense, MoE, and the hybrid DeltaNet families with their experts split); on the real
demo model over 3 ranks (its 9 heads, 3 KV heads), also with its GGUF blocks cut along K; and
options it cannot serve are refused naming tensor_parallel_size."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import hf_greedy, make_hf_model, state_bytes_per_slot
import revolta
from revolta import LLM, SamplingParams

PROMPTS = [[1, 17, 93, 4, 250, 61, 8, 140], [1, 5, 5, 200, 31], [1, 77] * 9, [1, 17, 93, 4, 250, 61, 8, 140, 3, 9]]
LOGIT_TOL = 2e-4  # partial sums added in another order: float32 rounding only


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# 4 DeltaNet key heads (8 value heads) split over 4 ranks; a shared expert of its own size.
HYBRID = dict(MOE, shared_expert_intermediate_size=48, linear_num_key_heads=4, linear_num_value_heads=8,
              linear_key_head_dim=16, linear_value_head_dim=16, head_dim=16, num_hidden_layers=4)
OVERRIDES = {"llama": dict(attention_bias=True), "qwen3": {}, "qwen3_moe": dict(MOE, mlp_only_layers=[1]),
             "qwen3_next": HYBRID, "qwen3_5_moe": HYBRID}


@pytest.fixture(scope="module", params=list(OVERRIDES))
def tiny(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"tp-{request.param}")
    model = make_hf_model(request.param, d, seed=3, **OVERRIDES[request.param])
    return str(d), model


def run(path: str, tp: int, prompts=PROMPTS, n: int = 12, **kw):
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, return_generation_logits=True)
    with LLM(path, tensor_parallel_size=tp, num_threads=2, **kw) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        stats = llm.stats()
        info = llm.model_info
    tokens = [o.outputs[0].token_ids for o in outs]
    logits = [np.asarray(o.outputs[0].generation_logits) for o in outs]
    return tokens, logits, outs, stats, info


def test_sharded_tokens_and_logits_equal_the_unsharded_model(tiny):
    path, hf = tiny
    want, want_logits, _, _, one = run(path, 1)
    assert want[0] == hf_greedy(hf, PROMPTS[0], 12)  # the reference nobody here wrote
    for tp in (2, 4):  # 4 ranks: each of the 2 KV heads cached on two of them
        got, logits, _, _, info = run(path, tp)
        assert got == want, f"tensor_parallel_size {tp}"
        for a, b in zip(want_logits, logits):
            assert np.abs(a - b).max() < LOGIT_TOL, np.abs(a - b).max()
        assert info.tensor_parallel_size == tp and info.kv_cache_bytes == tp * one.kv_cache_bytes
        # split, not copied: norms and routers are, and on 4 ranks each k / v head is held twice
        assert info.weight_bytes < (1.02 if tp == 2 else 1.15) * one.weight_bytes, (tp, info.weight_bytes)


def test_prefix_hits_and_preemption_under_tensor_parallelism(tiny):
    path, hf = tiny
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    # The first and last prompts share 8 tokens (two blocks of 4): asked after the first, the last hits.
    tokens, cached = {}, {}
    for tp in (1, 2):
        with LLM(path, tensor_parallel_size=tp, num_threads=2, block_size=4) as llm:
            first = llm.generate([{"prompt_token_ids": PROMPTS[0]}], params)
            later = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[1:]], params)
        tokens[tp] = [o.outputs[0].token_ids for o in first + later]
        cached[tp] = later[-1].num_cached_tokens
    # (dense models hit both blocks; hybrid ones resume from the state snapshot a block before)
    assert tokens[2] == tokens[1] and cached[2] == cached[1] >= 4, cached
    # A KV budget too small for all four at once: requests are preempted and recomputed.
    small = dict(block_size=4, max_model_len=40, max_num_seqs=4)
    want, _, _, _, _ = run(path, 1, n=20, kv_cache_memory_bytes=cache_bytes(hf, 1, 128, 4), **small)
    got, _, _, stats, _ = run(path, 2, n=20, kv_cache_memory_bytes=cache_bytes(hf, 2, 64, 4), **small)
    assert stats.num_preemptions > 0 and got == want


def cache_bytes(hf, tp: int, tokens: int, seqs: int) -> int:
    """A rank's float32 cache for `tokens` of KV and the recurrent states (with prefix snapshots) of `seqs`."""
    c = hf.config
    linear = sum(t == "linear_attention" for t in (getattr(c, "layer_types", None) or []))
    per_token = (c.num_hidden_layers - linear) * 2 * max(1, c.num_key_value_heads // tp) * c.head_dim * 4
    return per_token * tokens + seqs * 2 * state_bytes_per_slot(hf) // tp


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen3_next"])
def test_expert_parallelism_gives_the_tokens_of_one_rank(kind, tmp_path):
    """enable_expert_parallel: each rank holds 4 / N whole experts (its tokens' rows grouped by them)
    instead of a share of every expert; the greedy tokens and logits are one rank's, and the ranks
    hold the model's bytes once between them."""
    make_hf_model(kind, tmp_path, seed=11, **OVERRIDES[kind])
    want, want_logits, _, _, one = run(str(tmp_path), 1)
    for tp in (2, 4):
        got, logits, _, _, info = run(str(tmp_path), tp, enable_expert_parallel=True)
        assert got == want, f"tensor_parallel_size {tp} with expert parallelism"
        for a, b in zip(want_logits, logits):
            assert np.abs(a - b).max() < LOGIT_TOL, np.abs(a - b).max()
        assert info.weight_bytes < (1.02 if tp == 2 else 1.15) * one.weight_bytes, (tp, info.weight_bytes)


@pytest.mark.parametrize("kind", ["llama", "qwen3_next"])
def test_speculative_decoding_under_tensor_parallelism(kind, tmp_path):
    """Drafts verified on every rank give the greedy tokens of one rank without drafts: prompt-lookup
    drafts on a dense model; on the hybrid one MTP drafts (each rank runs the MTP layer on its own
    hidden states) with the recurrent state rolled back on every rank after rejections."""
    import tiny_mtp

    model = make_hf_model(kind, tmp_path, seed=7, **OVERRIDES[kind])
    method = "ngram"
    if kind == "qwen3_next":
        tiny_mtp.add_random_mtp(model, tmp_path, seed=8)
        method = "mtp"
    prompts = [[1, 17, 93, 4, 17, 93, 4, 17, 93], [1, 5, 5, 200, 31, 5, 5, 200], [1, 77] * 9]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)  # (no logits: they stop drafting)
    tokens, drafts = {}, 0
    for tp, spec in ((1, None), (2, {"method": method, "num_speculative_tokens": 2})):
        with LLM(str(tmp_path), tensor_parallel_size=tp, num_threads=2, speculative_config=spec) as llm:
            tokens[tp] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
            drafts = llm.stats().spec_num_drafts
    assert tokens[2] == tokens[1] and drafts > 0, drafts


@pytest.mark.parametrize("kind", ["llama", "qwen3_next"])
def test_async_scheduling_under_tensor_parallelism(kind, tmp_path):
    """Steps queued before the previous step's tokens are read: every rank feeds the greedy ids of
    its own logits; the tokens are those of one rank without async scheduling."""
    make_hf_model(kind, tmp_path, seed=9, **OVERRIDES[kind])
    prompts = [[1, 17, 93, 4, 250, 61, 8, 140], [1, 5, 5, 200, 31], [1, 77] * 9]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens, ahead = {}, 0
    for tp, mode in ((1, "off"), (2, "on")):
        with LLM(str(tmp_path), tensor_parallel_size=tp, num_threads=2, async_scheduling=mode) as llm:
            tokens[tp] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
            ahead = llm.stats().steps_run_ahead
    assert tokens[2] == tokens[1] and ahead > 0, ahead


def test_demo_model_over_three_ranks():
    """The real weights (the float32 import) over 3 ranks (9 heads, 3 KV heads, a 49,152-token
    vocabulary split in three)."""
    prompts = [[1, 504, 3458, 282, 4649, 314], list(range(100, 140))]
    path = revolta.demo_model("safetensors")
    want, want_logits, _, _, one = run(path, 1, prompts, n=8)
    got, logits, _, _, info = run(path, 3, prompts, n=8)
    assert got == want and info.tensor_parallel_size == 3
    # Every weight but the norms is split, the tied 49,152-token embedding and head included.
    assert info.weight_bytes < 1.01 * one.weight_bytes, (info.weight_bytes, one.weight_bytes)
    for a, b in zip(want_logits, logits):
        assert np.abs(a - b).max() < 1e-3, np.abs(a - b).max()


def test_demo_gguf_blocks_cut_along_k():
    """The demo read in place keeps the Q4_1 / Q8_0 blocks: o and down are cut at whole blocks (576 / 3
    and 1536 / 3 columns), so each rank holds a third of them, still quantized. Decode steps meet
    them with 16-bit activations per row of each rank's slice, so the sharded logits stay near the
    unsharded ones and the float32 import's, over the steps whose context the runs share; 8-bit
    activations (block_activation_bits 8) move them further (and may flip a near-tie later on)."""
    prompts = [[1, 504, 3458, 282, 4649, 314], list(range(100, 140))]
    kw = dict(n=8, max_model_len=256)
    _, exact, _, _, _ = run(None, 1, prompts, load_format="safetensors", **kw)
    _, want, _, _, one = run(None, 1, prompts, **kw)
    _, got, _, _, three = run(None, 3, prompts, **kw)
    for e, a, b in zip(exact, want, got):
        assert np.abs(a[0] - b[0]).max() < 1e-3 and np.abs(a[:2] - b[:2]).max() < 1e-2
        assert np.abs(b[:2] - e[:2]).max() < 0.05 and b[1].argmax() == e[1].argmax()
    _, coarse, _, _, _ = run(None, 3, prompts, block_activation_bits=8, **kw)
    for e, c in zip(exact, coarse):
        assert np.abs(c[0] - e[0]).max() < 1.0 and c[0].argmax() == e[0].argmax()
    assert three.weight_bytes < 1.01 * one.weight_bytes  # split, still in blocks


def test_options_it_cannot_serve_are_refused(tiny, tmp_path):
    path, _ = tiny
    with pytest.raises(ValueError, match="tensor_parallel_size 3"):  # 4 heads do not split in three
        LLM(path, tensor_parallel_size=3)
    make_hf_model("qwen3_next", tmp_path, **dict(HYBRID, linear_num_key_heads=2, linear_num_value_heads=4))
    with pytest.raises(ValueError, match="tensor_parallel_size 4: the model's 2 DeltaNet key heads do not split"):
        LLM(str(tmp_path), tensor_parallel_size=4)


def test_server_over_three_ranks_answers_the_openai_sdk_as_one_rank(demo_model_dir):
    """`revolta-server --tensor-parallel-size 3` (a real server process, the demo model) gives the
    official SDK the completion of the unsharded engine, and says the ranks in its startup log."""
    openai = pytest.importorskip("openai")
    from server_fixture import ServerProcess

    prompt = "The capital of France is"
    with LLM(demo_model_dir, num_threads=2) as llm:
        want = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0].outputs[0].text
    server = ServerProcess("--tensor-parallel-size", "3", "--num-threads", "2")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        name = client.models.list().data[0].id
        out = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0.0,
                                        extra_body={"ignore_eos": True})
    finally:
        log = server.stop()
    assert out.choices[0].text == want and len(want) > 0
    assert "x 3 tensor-parallel ranks" in log
