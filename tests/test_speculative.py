"""Speculative decoding with n-gram (prompt lookup) drafts: greedy verification gives token for
token the output of decoding without it, on every attention architecture's tiny config, under
concurrency, prefix hits, chunked prefill and preemption; drafts are really verified (the
acceptance counters move); bad configurations are refused naming speculative_config."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_hf_model
from revolta import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


def prompts() -> list[dict]:
    rng = np.random.default_rng(7)
    base = [rng.integers(3, 256, size=n).tolist() for n in (5, 17, 40, 9, 70, 3)]
    # Prompts that repeat themselves, so lookups find drafts from the first step on.
    return [{"prompt_token_ids": p} for p in base + [base[0] * 4, base[3] * 3, (base[1] + base[3]) * 2]]


@pytest.fixture(scope="module", params=[("llama", {}), ("qwen3", {}), ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2,
                                                                                      moe_intermediate_size=32))],
                ids=["llama", "qwen3", "qwen3_moe"])
def model_dir(request, tmp_path_factory):
    kind, extra = request.param
    d = tmp_path_factory.mktemp(kind)
    make_hf_model(kind, d, seed=4, max_position_embeddings=512, **extra)
    return str(d)


def run(model_dir, spec, params, **engine):
    engine.setdefault("max_model_len", 512)
    with LLM(model_dir, speculative_config=spec, **engine) as llm:
        first = llm.generate(prompts(), params)
        again = llm.generate(prompts(), params)  # the same prompts: prefix-cache hits
        stats = llm.stats()
    return [o.outputs[0].token_ids for o in first], [o.outputs[0].token_ids for o in again], stats


@pytest.mark.parametrize("engine", [
    dict(kv_cache_memory_bytes=16 << 20),
    dict(kv_cache_memory_bytes=16 << 20, max_num_batched_tokens=24),  # chunked prefill, drafts dropped for budget
    dict(kv_cache_memory_bytes=150 << 10, block_size=4, max_num_seqs=9, max_model_len=260),  # 300 token slots: preemption
], ids=["plain", "chunked", "preemption"])
def test_greedy_output_is_unchanged(model_dir, engine):
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    ref, ref_again, ref_stats = run(model_dir, None, params, **engine)
    out, out_again, stats = run(model_dir, NGRAM, params, **engine)
    assert out == ref and out_again == ref_again
    assert ref == ref_again
    assert stats.spec_num_drafts > 0 and stats.spec_num_accepted_tokens > 0  # drafts were verified and taken
    assert stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens
    per_pos = list(stats.spec_accepted_per_position)
    assert len(per_pos) == 4 and sum(per_pos) == stats.spec_num_accepted_tokens
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # position j is accepted only after j - 1
    assert stats.num_steps < ref_stats.num_steps  # fewer steps for the same tokens
    assert stats.spec_verify_time_us > 0 and stats.spec_draft_time_us >= 0
    assert stats.num_blocks_used == 0 and stats.prefix_cache_hits > 0
    if engine.get("block_size") == 4:
        assert stats.num_preemptions > 0 and ref_stats.num_preemptions > 0


def test_stops_lengths_and_sampled_neighbours(model_dir):
    """A stop token inside accepted drafts, max_tokens reached mid-draft, and seeded sampled
    requests sharing the steps (with logprobs, which do not draft: their draws are unchanged):
    all as without speculation."""
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    with LLM(model_dir, max_model_len=512) as base:
        ref = [o.outputs[0].token_ids for o in base.generate(prompts(), greedy)]
    stop = ref[6][20]  # a token the repetitive prompt's output produces (drafted, likely accepted)
    mixed = [SamplingParams(temperature=0.0, max_tokens=37, stop_token_ids=[stop]) if i % 3 == 0 else
             SamplingParams(temperature=0.9, top_p=0.9, seed=100 + i, max_tokens=29, ignore_eos=True, logprobs=0) if i % 3 == 1 else
             SamplingParams(temperature=0.0, max_tokens=13, ignore_eos=True) for i in range(len(prompts()))]
    outs = {}
    for spec in (None, NGRAM):
        with LLM(model_dir, max_model_len=512, speculative_config=spec) as llm:
            outs[bool(spec)] = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(prompts(), mixed)]
    assert outs[True] == outs[False]
    assert any(r == "stop" for _, r in outs[True])


def test_bad_configurations_are_refused(model_dir):
    with pytest.raises(ValueError, match="speculative_config: method 'mtp' needs multi-token-prediction layers"):
        LLM(model_dir, speculative_config={"method": "mtp", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="method must be 'ngram' or 'mtp'"):
        LLM(model_dir, speculative_config={"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(model_dir, speculative_config={"method": "ngram"})
    with pytest.raises(ValueError, match="unknown field.*lookahead"):
        LLM(model_dir, speculative_config={"method": "ngram", "lookahead": 3})
    with pytest.raises(ValueError, match="draft_sample_method"):
        LLM(model_dir, speculative_config={**NGRAM, "draft_sample_method": "probabilistic"})
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        LLM(model_dir, speculative_config={**NGRAM, "prompt_lookup_min": 5})


HYBRID = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
              head_dim=16, num_hidden_layers=4)


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5_moe"])
def hybrid_dir(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    make_hf_model(request.param, d, seed=4, max_position_embeddings=512, **HYBRID)
    return str(d)


@pytest.mark.parametrize("engine", [
    dict(kv_cache_memory_bytes=16 << 20),
    dict(kv_cache_memory_bytes=16 << 20, max_num_batched_tokens=24),
    dict(kv_cache_memory_bytes=560 << 10, block_size=4, max_num_seqs=9, max_model_len=260),  # preemption
], ids=["plain", "chunked", "preemption"])
def test_recurrent_state_rolls_back(hybrid_dir, engine):
    """Gated DeltaNet models: a verify step saves each drafting request's state in a second slot;
    after a rejection the state goes back to it and is replayed through the kept tokens. Greedy
    output is unchanged, with prefix hits (state snapshots) and preemption."""
    params = SamplingParams(temperature=0.0, max_tokens=160 if "block_size" not in engine else 90, ignore_eos=True)
    ref, ref_again, ref_stats = run(hybrid_dir, None, params, **engine)
    out, out_again, stats = run(hybrid_dir, NGRAM, params, **engine)
    assert out == ref and out_again == ref_again
    assert stats.spec_num_draft_tokens > stats.spec_num_accepted_tokens > 0  # both paths taken
    assert stats.num_blocks_used == 0 and stats.prefix_cache_hits > 0
    if "block_size" in engine:
        assert stats.num_preemptions > 0

QUOTE = ("The quick brown fox jumps over the lazy dog. The dog was not amused, and it chased the fox around the "
         "farm until the farmer came out with a broom and told them both to be quiet.")
QUOTING = [[{"role": "user", "content": f"Repeat this text exactly, word for word:\n\n{QUOTE}"}],
           [{"role": "user", "content": "Fix the spelling in this text and return it:\n\nThe quik brown fox jumpd over the lazzy dog."}],
           [{"role": "user", "content": f"Copy the second sentence of this text:\n\n{QUOTE}"}]]


def test_ngram_on_the_demo_model_quoting_its_input(demo_model_dir):
    """Drafts that can be right: the real SmolLM2 quoting, editing and extracting from its prompt.
    Same text as without speculation; the acceptance is reported and held above a floor (79 of 120
    drafts, 66%, and 27 steps against 42 when this was written)."""
    params = SamplingParams(temperature=0.0, max_tokens=80)
    texts, stats = {}, {}
    for spec in (None, NGRAM | {"prompt_lookup_max": 3}):
        with LLM(demo_model_dir, max_model_len=1024, kv_cache_memory_bytes=64 << 20, speculative_config=spec) as llm:
            texts[bool(spec)] = [o.outputs[0].text for o in llm.chat(QUOTING, params)]
            stats[bool(spec)] = llm.stats()
    assert texts[True] == texts[False]
    s = stats[True]
    rate = s.spec_num_accepted_tokens / s.spec_num_draft_tokens
    mean_accepted = s.spec_num_accepted_tokens / s.spec_num_drafts
    print(f"ngram on SmolLM2: {s.spec_num_accepted_tokens}/{s.spec_num_draft_tokens} drafts accepted ({rate:.0%}), "
          f"{mean_accepted:.2f} per verify step, per position {list(s.spec_accepted_per_position)}, "
          f"{s.num_steps} steps against {stats[False].num_steps}")
    assert rate >= 0.45 and s.num_steps <= 0.8 * stats[False].num_steps


def test_server_flag_and_metrics(demo_model_dir):
    import httpx

    from server_fixture import ServerProcess

    srv = ServerProcess("--model", demo_model_dir, "--served-model-name", "smol", "--max-model-len", "1024",
                        "--kv-cache-memory-bytes", str(64 << 20),
                        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}')
    try:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "model": "smol", "messages": QUOTING[0], "max_tokens": 60, "temperature": 0})
        assert r.status_code == 200
        with LLM(demo_model_dir, max_model_len=1024, kv_cache_memory_bytes=64 << 20) as llm:
            plain = llm.chat(QUOTING[0], SamplingParams(temperature=0.0, max_tokens=60))[0].outputs[0].text
        assert r.json()["choices"][0]["message"]["content"] == plain
        metrics = httpx.get(srv.url + "/metrics").text
        accepted = [line for line in metrics.splitlines() if line.startswith("revolta:spec_decode_num_accepted_tokens ")]
        assert accepted and float(accepted[0].split()[-1]) > 0
        assert 'revolta:spec_decode_num_accepted_tokens_per_pos{position="0"}' in metrics
        verify = [line for line in metrics.splitlines() if line.startswith("revolta:spec_decode_verify_seconds ")]
        assert verify and float(verify[0].split()[-1]) > 0
        values = {line.split()[0]: float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("revolta:spec")}
        steps, accepted = values["revolta:spec_decode_num_drafts"], values["revolta:spec_decode_num_accepted_tokens"]
        buckets = [values[f'revolta:spec_decode_accepted_length_bucket{{le="{le}"}}'] for le in ("0", "1", "2", "3", "+Inf")]
        assert buckets == sorted(buckets) and buckets[-1] == steps > buckets[0]
        assert values["revolta:spec_decode_accepted_length_sum"] == accepted
        # the histogram's mean is the accepted tokens per verify step
        assert sum(steps - b for b in buckets[:-1]) == accepted
        assert abs(values["revolta:spec_decode_acceptance_rate"] -
                   accepted / values["revolta:spec_decode_num_draft_tokens"]) < 1e-9
    finally:
        assert "Traceback" not in srv.stop()
    bad = __import__("subprocess").run([__import__("sys").executable, "-m", "revolta.server.cli", "--port", "0", "--model", demo_model_dir,
                                        "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
                                       capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "speculative_config" in bad.stderr.splitlines()[-1]


def chi_square_same(a: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, float]:
    """Two equal-sized samples of categories: the chi-square statistic of 'same distribution' over
    the categories both make common enough (the rest pooled), and its critical value at alpha
    (Wilson-Hilferty; alpha is the test's false-failure rate)."""
    cats = np.union1d(a, b)
    ca = np.array([(a == c).sum() for c in cats], float)
    cb = np.array([(b == c).sum() for c in cats], float)
    common = (ca + cb) >= 10
    ca = np.append(ca[common], ca[~common].sum())
    cb = np.append(cb[common], cb[~common].sum())
    keep = (ca + cb) > 0
    ca, cb = ca[keep], cb[keep]
    stat = float(((ca - cb) ** 2 / (ca + cb)).sum())
    df = len(ca) - 1
    z = {1e-3: 3.090, 5e-4: 3.291}[alpha]
    crit = df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
    return stat, crit


@pytest.fixture(scope="module")
def peaky_llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("peaky")
    make_hf_model("llama", d, seed=9, max_position_embeddings=256, initializer_range=0.25)
    return str(d)


def sampled_pairs(model_dir, spec, n: int, **engine) -> np.ndarray:
    # Every token of 3..250 once: whatever comes first, a 1-gram lookup finds it in the prompt and
    # drafts what followed it there, a guess the model mostly rejects.
    prompt = {"prompt_token_ids": np.random.default_rng(3).permutation(np.arange(3, 251)).tolist()}
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=s, max_tokens=4, ignore_eos=True) for s in range(n)]
    with LLM(model_dir, max_model_len=256, kv_cache_memory_bytes=256 << 20, max_num_seqs=256, speculative_config=spec,
             **engine) as llm:
        outs = llm.generate([prompt] * n, params)
        stats = llm.stats()
    if spec:
        assert stats.spec_num_drafts > n // 2
    return np.array([o.outputs[0].token_ids for o in outs])


def test_sampled_output_follows_the_target_distribution(peaky_llama, monkeypatch):
    """Verification of sampled n-gram drafts keeps the target distribution: tokens 2 and 3 of 3,000
    seeded requests (the first comes from the prefill, before any draft) with and without
    speculation pass a chi-square test of equality (each at a false-failure rate of 0.05%), and a
    wrong rule that keeps every draft fails it."""
    n = 3000
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    base = sampled_pairs(peaky_llama, None, n)
    with_spec = sampled_pairs(peaky_llama, spec, n)
    for pos in (1, 2):
        stat, crit = chi_square_same(base[:, pos], with_spec[:, pos], 5e-4)
        assert stat < crit, (pos, stat, crit)
    monkeypatch.setenv("REVOLTA_FAULT_INJECT", "accept-drafts")
    wrong = sampled_pairs(peaky_llama, spec, n)
    stat, crit = chi_square_same(base[:, 1], wrong[:, 1], 5e-4)
    assert stat > crit, (stat, crit)
