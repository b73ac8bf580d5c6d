"""Embeddings (LLM.embed, vLLM's) against transformers: the base model's last_hidden_state pooled as
the model's sentence-transformers config says (last token or mean), normalised, within 1e-4; under
chunked prefill, with a cached prefix, beside generating requests, and on a hybrid model."""

from __future__ import annotations

import json

import pytest
import torch

from revolta import LLM, SamplingParams
from conftest import make_hf_model

PROMPTS = [[5, 17, 99, 3, 42, 8, 8, 61], [7, 7, 8, 120, 64, 33, 9], list(range(10, 60))]


def write_pooling(path, mode: str, normalize: bool = True) -> None:
    """sentence-transformers' files: a Pooling module (mode) and, if asked, a Normalize module."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    flags = {k: False for k in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                                "pooling_mode_lasttoken")}
    flags[{"mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken", "cls": "pooling_mode_cls_token"}[mode]] = True
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **flags}))


@torch.no_grad()
def hf_embedding(hf, ids, mode, normalize=True):
    h = hf.model(torch.tensor([ids]), use_cache=False).last_hidden_state[0].float()
    v = h.mean(0) if mode == "mean" else h[-1]
    return torch.nn.functional.normalize(v, dim=0) if normalize else v


def close(ours, ref):
    assert torch.allclose(torch.tensor(ours), ref, atol=1e-4), (torch.tensor(ours) - ref).abs().max()


@pytest.mark.parametrize("kind,mode", [("llama", "last"), ("qwen3", "mean"), ("qwen3_next", "mean"), ("qwen3_next", "last")])
def test_embeddings_match_transformers(tmp_path, kind, mode):
    hf = make_hf_model(kind, tmp_path, seed=2)
    write_pooling(tmp_path, mode, normalize=mode == "last")
    # Small steps: the prompts arrive in chunks; the long one is embedded twice (a cached prefix).
    with LLM(str(tmp_path), max_model_len=128, max_num_batched_tokens=16, enable_prefix_caching=True) as llm:
        outs = llm.embed(PROMPTS + [PROMPTS[2]])
        for ids, o in zip(PROMPTS + [PROMPTS[2]], outs):
            assert o.prompt_token_ids == ids
            close(o.outputs.embedding, hf_embedding(hf, ids, mode, normalize=mode == "last"))
        raw = llm.embed(PROMPTS[0], normalize=False)[0].outputs.embedding
        close(raw, hf_embedding(hf, PROMPTS[0], mode, normalize=False))


def test_embedding_beside_generation(tmp_path):
    """Pooling requests share the engine's steps with a generating one: the generated tokens are
    HF's greedy ones and the embeddings HF's."""
    from conftest import hf_greedy

    hf = make_hf_model("llama", tmp_path, seed=4)
    embedded = [PROMPTS[0], PROMPTS[2], PROMPTS[0]]
    with LLM(str(tmp_path), max_model_len=128) as llm:
        tokens, vectors = generate_beside_embeddings(llm, PROMPTS[1], 12, embedded)
    assert tokens == hf_greedy(hf, PROMPTS[1], 12)
    for v, p in zip(vectors, embedded):
        close(v, hf_embedding(hf, p, "last"))


def generate_beside_embeddings(llm, prompt, n, embedded):
    """One greedy request of n tokens and pooling requests, added at once to the engine: (the
    generated tokens, each pooled vector normalised). A pooling request's output has no tokens."""
    from revolta import _core, pooling

    gen = SamplingParams(temperature=0, max_tokens=n).to_core(n)
    embed = pooling.pooling_params(llm.pooling_config())
    ids = llm.engine.add_requests([prompt, *embedded], [gen] + [embed] * len(embedded),
                                  [_core.SchedulingTag()] * (1 + len(embedded)))
    tokens, vectors, done = [], {}, set()
    while len(done) < len(ids):
        for out in llm.engine.await_outputs(0.05):
            if out.request_id == ids[0]:
                tokens += [t.token for t in out.tokens]
            elif out.finished:
                assert not out.tokens
                vectors[out.request_id] = pooling.finish(list(out.embedding), True)
            if out.finished:
                done.add(out.request_id)
    return tokens, [vectors[rid] for rid in ids[1:]]


def test_unsupported_pooling_is_named(tmp_path):
    make_hf_model("llama", tmp_path)
    write_pooling(tmp_path, "cls")
    with LLM(str(tmp_path), max_model_len=64) as llm:
        with pytest.raises(ValueError, match="pooling cls_token is not supported"):
            llm.embed([1, 2, 3])


def test_embeddings_under_mtp_speculation(tmp_path):
    """An engine speculating with MTP layers embeds too (the drafter leaves pooling requests alone)
    while it decodes a speculating request beside them; the vectors are transformers'."""
    import tiny_mtp
    from conftest import hf_greedy

    hybrid = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  head_dim=16, num_hidden_layers=4)
    hf = make_hf_model("qwen3_next", tmp_path, seed=5, max_position_embeddings=256, **hybrid)
    tiny_mtp.add_random_mtp(hf, tmp_path, seed=6)
    with LLM(str(tmp_path), max_model_len=128, speculative_config={"method": "mtp", "num_speculative_tokens": 2}) as llm:
        tokens, vectors = generate_beside_embeddings(llm, PROMPTS[1], 10, [PROMPTS[0], PROMPTS[2]])
    assert tokens == hf_greedy(hf, PROMPTS[1], 10)
    close(vectors[0], hf_embedding(hf, PROMPTS[0], "last"))
    close(vectors[1], hf_embedding(hf, PROMPTS[2], "last"))
