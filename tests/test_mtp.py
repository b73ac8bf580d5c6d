"""Speculative decoding with the checkpoint's multi-token-prediction (MTP) layers.

The engine's drafts equal those of a reference head made of transformers' own Qwen3-Next /
Qwen3.5 modules (tests/tiny_mtp.py); greedy output is token for token that of decoding without
speculation, under concurrency, chunked prefill, prefix hits and preemption; and on a tiny hybrid
model whose MTP layer was trained on Shakespeare, the acceptance per draft position stays at
what the trained head achieved, measured by the reference, when it was made."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import tiny_mtp
from conftest import make_hf_model
from revolta import LLM, SamplingParams

HYBRID = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
              head_dim=16, num_hidden_layers=4)


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5_moe"])
def random_mtp(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param + "_mtp")
    model = make_hf_model(request.param, d, seed=5, max_position_embeddings=512, **HYBRID)
    head = tiny_mtp.add_random_mtp(model, d, seed=6)
    return str(d), model, head


def prompts(n_max: int = 70) -> list[list[int]]:
    rng = np.random.default_rng(11)
    base = [rng.integers(3, 256, size=n).tolist() for n in (5, 17, 40, 9, n_max, 3)]
    return base + [base[0] * 4, base[3] * 3]


def test_drafts_equal_the_reference_head(random_mtp, monkeypatch):
    """Every draft kept (accept-drafts:1), so the output alternates the MTP layer's draft and the
    target's token after it; each must be the reference's argmax (up to a near-tie)."""
    d, model, head = random_mtp
    monkeypatch.setenv("REVOLTA_FAULT_INJECT", "accept-drafts:1")
    with LLM(d, max_model_len=512, speculative_config={"method": "mtp", "num_speculative_tokens": 1}) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts()],
                            SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True))  # 1 + 12 x (draft, target)
        stats = llm.stats()
    assert stats.spec_num_drafts > 0 and stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
    checked = tiny_mtp.check_alternating_drafts(model, head, prompts(), [list(o.outputs[0].token_ids) for o in outs])
    assert checked >= 60


@pytest.mark.parametrize("engine", [
    dict(kv_cache_memory_bytes=16 << 20),
    dict(kv_cache_memory_bytes=16 << 20, max_num_batched_tokens=24),  # chunked prefill; drafts dropped for budget
    dict(kv_cache_memory_bytes=600 << 10, block_size=4, max_num_seqs=8, max_model_len=260),  # preemption
], ids=["plain", "chunked", "preemption"])
def test_greedy_output_is_unchanged(random_mtp, engine):
    d = random_mtp[0]
    engine.setdefault("max_model_len", 512)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outs, stats = {}, {}
    for spec in (None, {"method": "mtp", "num_speculative_tokens": 3}):
        with LLM(d, speculative_config=spec, **engine) as llm:
            first = llm.generate([{"prompt_token_ids": p} for p in prompts()], params)
            again = llm.generate([{"prompt_token_ids": p} for p in prompts()], params)  # prefix hits
            outs[bool(spec)] = [o.outputs[0].token_ids for o in first + again]
            stats[bool(spec)] = llm.stats()
    assert outs[True] == outs[False]
    s = stats[True]
    assert s.spec_num_drafts > 0 and s.num_blocks_used == 0 and s.prefix_cache_hits > 0
    if "block_size" in engine:
        assert s.num_preemptions > 0


def test_bad_configurations_are_refused(tmp_path):
    plain = tmp_path / "plain"
    make_hf_model("qwen3_next", plain, seed=1, **HYBRID)
    with pytest.raises(ValueError, match="method 'mtp' needs multi-token-prediction layers.*mtp_num_hidden_layers"):
        LLM(str(plain), speculative_config={"method": "mtp"})
    cfg = json.loads((plain / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1  # named, not carried
    (plain / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="speculative_config: method 'mtp'.*carries 0 of the 1"):
        LLM(str(plain), speculative_config={"method": "mtp"})
    with pytest.raises(ValueError, match="draft_sample_method must be 'greedy' or 'probabilistic'"):
        LLM(str(plain), speculative_config={"method": "mtp", "draft_sample_method": "beam"})


def trained_dir() -> Path:
    """The Shakespeare-trained tiny model, made once per version of tests/tiny_mtp.py and cached."""
    source = Path(tiny_mtp.__file__).read_bytes()
    root = Path(os.environ.get("REVOLTA_TEST_CACHE", Path.home() / ".cache" / "revolta-tests"))
    d = root / f"tiny-mtp-shakespeare-{hashlib.sha256(source).hexdigest()[:12]}"
    if not (d / "acceptance.json").exists():
        tiny_mtp.train(d)
    return d


def test_trained_head_acceptance():
    """Drafts that can be right: the acceptance of each draft position and the mean accepted
    length over verify steps must hold what the reference measured when the head was trained
    (the same greedy steps, simulated in torch), and the text is that of plain decoding."""
    d = trained_dir()
    made = json.loads((d / "acceptance.json").read_text())
    held_out = json.loads((d / "prompts.json").read_text())
    k = tiny_mtp.ACCEPTANCE_K
    params = SamplingParams(temperature=0.0, max_tokens=tiny_mtp.ACCEPTANCE_TOKENS, ignore_eos=True)
    outs, stats = {}, {}
    for spec in (None, {"method": "mtp", "num_speculative_tokens": k}):
        with LLM(str(d), max_model_len=512, speculative_config=spec) as llm:
            outs[bool(spec)] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in held_out], params)]
            stats[bool(spec)] = llm.stats()
    assert outs[True] == outs[False]
    s = stats[True]
    per_pos = [a / s.spec_num_drafts for a in s.spec_accepted_per_position]
    made_pos = [a / made["steps"] for a in made["accepted_per_position"]]
    mean = s.spec_num_accepted_tokens / s.spec_num_drafts
    print(f"trained MTP head, k={k}: acceptance per position {[f'{r:.2f}' for r in per_pos]} (made: "
          f"{[f'{r:.2f}' for r in made_pos]}), mean accepted {mean:.2f} (made: {made['mean_accepted']:.2f}), "
          f"{s.num_steps} steps against {stats[False].num_steps}")
    assert made_pos[0] >= 0.3  # the head learned something: a third of first drafts right at least
    for got, want in zip(per_pos, made_pos):
        assert got >= want - 0.05
    assert mean >= made["mean_accepted"] - 0.1
    assert s.num_steps < 0.8 * stats[False].num_steps


def byte_tokenizer(d: Path) -> None:
    """tokenizer.json for the byte vocabulary (token = byte), in the `tokenizers` library's format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE({ch: b for b, ch in _bytes_to_unicode().items()}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(d / "tokenizer.json"))


def _bytes_to_unicode() -> dict[int, str]:
    # The byte -> character table of byte-level BPE (GPT-2's), which ByteLevel pre-tokenizes with.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def test_server_with_mtp_speculation(tmp_path):
    """--speculative-config with method mtp on the server: the same completion as the offline
    engine without speculation, and the drafts show in /metrics."""
    import shutil

    import httpx

    from server_fixture import ServerProcess

    d = tmp_path / "model"
    shutil.copytree(trained_dir(), d)
    byte_tokenizer(d)
    prompt = bytes(json.loads((d / "prompts.json").read_text())[0]).decode("latin-1")
    with LLM(str(d), max_model_len=512) as llm:
        assert llm.get_tokenizer().encode(prompt) == list(prompt.encode("latin-1"))  # token = byte
        plain = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))[0].outputs[0].text
    srv = ServerProcess("--model", str(d), "--served-model-name", "tiny", "--max-model-len", "512",
                        "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')
    try:
        r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == plain
        metrics = httpx.get(srv.url + "/metrics").text
        accepted = [line for line in metrics.splitlines() if line.startswith("revolta:spec_decode_num_accepted_tokens ")]
        assert accepted and float(accepted[0].split()[-1]) > 0
    finally:
        assert "Traceback" not in srv.stop()


def test_probabilistic_drafts_keep_the_distribution(tmp_path, monkeypatch):
    """draft_sample_method probabilistic: sampled requests draw their drafts from the MTP layer's
    distribution and keep each with probability min(1, p / q), else draw from max(0, p - q).
    Tokens 2 and 3 of 3,000 seeded requests with and without speculation pass the chi-square test
    of tests/test_speculative.py (each at a false-failure rate of 0.05%); keeping every draft fails it."""
    from test_speculative import chi_square_same

    model = make_hf_model("qwen3_next", tmp_path, seed=8, max_position_embeddings=256, initializer_range=0.25, **HYBRID)
    tiny_mtp.add_random_mtp(model, tmp_path, seed=9, std=0.25)  # peaky p and q, unlike each other
    spec = {"method": "mtp", "num_speculative_tokens": 2, "draft_sample_method": "probabilistic"}
    prompt = {"prompt_token_ids": np.random.default_rng(3).integers(3, 256, size=12).tolist()}
    n = 3000

    def draws(spec, forced=False):
        params = [SamplingParams(temperature=1.0, top_p=0.95, seed=s, max_tokens=4, ignore_eos=True) for s in range(n)]
        with LLM(str(tmp_path), max_model_len=256, kv_cache_memory_bytes=256 << 20, max_num_seqs=256,
                 speculative_config=spec) as llm:
            outs = llm.generate([prompt] * n, params)
            s = llm.stats()
        if spec and not forced:
            print(f"probabilistic MTP drafts: {s.spec_num_accepted_tokens} of {s.spec_num_draft_tokens} accepted")
            assert s.spec_num_drafts > n // 2 and 0 < s.spec_num_accepted_tokens < s.spec_num_draft_tokens
        return np.array([o.outputs[0].token_ids for o in outs])

    base, with_spec = draws(None), draws(spec)
    for pos in (1, 2):
        stat, crit = chi_square_same(base[:, pos], with_spec[:, pos], 5e-4)
        assert stat < crit, (pos, stat, crit)
    monkeypatch.setenv("REVOLTA_FAULT_INJECT", "accept-drafts")
    stat, crit = chi_square_same(base[:, 1], draws(spec, forced=True)[:, 1], 5e-4)
    assert stat > crit, (stat, crit)
