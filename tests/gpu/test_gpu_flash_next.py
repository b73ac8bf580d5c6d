"""Flash-Next on the GPU against the CPU engine (`pytest -m gpu`): hyper-connections, QSA's block
choice and sparse attention, n-gram PLE (its table in host memory, its window and conv history in
the device's state slots, the indexer keys in the device's KV blocks), on the tiny reference model
with a QSA ratio of 4 and PLE (tools/qwen4exp_reference.py).

Both engines run float32 weights and caches, so the GPU follows the CPU's cell choices; greedy
tokens match except where the CPU itself was at a near-tie. The checkpoint comes from
REVOLTA_TEST_DATA/qwen4exp/hc2-qsa4-ple (made where transformers 5.25 is installed:
`python -c "import sys; sys.path[:0] = ['tools']; import qwen4exp_reference as r, pathlib;
r.make_checkpoint('hc2-qsa4-ple', pathlib.Path('DIR/qwen4exp/hc2-qsa4-ple'))"`), or is made here."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_greedy_until_near_tie, greedy

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import qwen4exp_reference as ref  # noqa: E402

CASE = "hc2-qsa4-ple"
GEN = 24
NEAR_TIE = 0.03
PROMPTS = [ref.PROMPT, [(11 * i + 5) % 500 + 3 for i in range(300)], [9, 8, 7, 6, 5], [ref.EOS] * 3 + list(range(40, 90))]


def checkpoint(tmp_path_factory) -> str:
    given = Path(os.environ.get("REVOLTA_TEST_DATA", "/nonexistent")) / "qwen4exp" / CASE
    if (given / "config.json").exists():
        return str(given)
    path = tmp_path_factory.mktemp(CASE)
    ref.make_checkpoint(CASE, path)  # needs transformers with qwen4_exp (5.25)
    return str(path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    import revolta

    d = checkpoint(tmp_path_factory)
    common = dict(max_model_len=1024, kv_cache_memory_bytes=64 << 20, enable_prefix_caching=True, max_num_seqs=8,
                  dtype="float32", kv_cache_dtype="float32")
    cpu = revolta.LLM(d, **common)
    gpu = revolta.LLM(d, device="cuda", gpu_memory_utilization=0.0, **common)
    yield cpu, gpu
    cpu.engine.shutdown()
    gpu.engine.shutdown()
    del cpu, gpu
    gc.collect()


def test_greedy_and_logits_match_the_cpu(pair):
    cpu, gpu = pair
    for p in PROMPTS:
        c, g = cpu.generate([p], greedy(GEN, True))[0], gpu.generate([p], greedy(GEN, True))[0]
        assert_greedy_until_near_tie(c, g, NEAR_TIE, GEN)
        lc, lg = np.asarray(c.outputs[0].generation_logits[0]), np.asarray(g.outputs[0].generation_logits[0])
        assert np.max(np.abs(lc - lg)) < 1e-3 * (1 + np.max(np.abs(lc))), np.max(np.abs(lc - lg))


def test_concurrent_requests_and_prefix_cache_hits(pair):
    """Four requests in one batch (prefill chunks beside decode rows), then again from the prefix
    cache: KV blocks with their indexer keys, and state snapshots with the PLE window and history."""
    cpu, gpu = pair
    first = gpu.generate(PROMPTS, greedy(GEN))
    hits = gpu.engine.stats().prefix_cache_hits
    second = gpu.generate(PROMPTS, greedy(GEN))
    assert gpu.engine.stats().prefix_cache_hits > hits
    for p, a, b in zip(PROMPTS, first, second):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert_greedy_until_near_tie(cpu.generate([p], greedy(GEN, True))[0], a, NEAR_TIE, GEN)


def test_many_sequences_under_preemption(pair, tmp_path_factory):
    """48 sequences in a cache that holds about 12 (a batch as wide as the benchmark's c64 on the
    tiny model): preempted and resumed, each as the CPU engine gives it."""
    import json

    import revolta

    cpu, _ = pair
    d = checkpoint(tmp_path_factory)
    c = json.loads((Path(d) / "config.json").read_text())
    attention = sum(t != "linear_attention" for t in c["layer_types"])
    per_token = attention * (2 * c["num_key_value_heads"] * c["head_dim"] + c["indexer_head_dim"]) * 4
    conv_dim = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + c["linear_num_value_heads"] * c["linear_value_head_dim"]
    gdn = conv_dim * (c["linear_conv_kernel_dim"] - 1) + c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"]
    ple = (c["ngram_size"] - 1) + c["hc_count"] * c["hidden_size"] * (c["ple_conv_kernel_size"] - 1) * c["ngram_size"]
    state = 4 * ((len(c["layer_types"]) - attention) * gdn + len(c["ple_layer_ids"]) * ple)
    seqs, block = 48, 16
    prompts = [[(7 * i + 13 * j) % 500 + 3 for i in range(60)] for j in range(seqs)]
    kv = seqs * state + 12 * 6 * block * per_token
    with revolta.LLM(d, device="cuda", gpu_memory_utilization=0.0, max_model_len=128, block_size=block,
                     max_num_seqs=seqs, enable_prefix_caching=False, dtype="float32", kv_cache_dtype="float32",
                     kv_cache_memory_bytes=kv) as gpu:
        outs = gpu.generate(prompts, greedy(GEN))
        assert gpu.engine.stats().num_preemptions > 0
    for p, out in zip(prompts, outs):
        assert_greedy_until_near_tie(cpu.generate([p], greedy(GEN, True))[0], out, NEAR_TIE, GEN)


def test_mtp_speculation_keeps_the_cpu_tokens(pair, tmp_path_factory):
    """The model with a random MTP layer (tests/tiny_mtp.py; REVOLTA_TEST_DATA/qwen4exp/<case>-mtp,
    or made here), three drafts a step, nearly all rejected: each verify step rolls DeltaNet and
    PLE's window and conv history back in the device's state slots and replays them; the tokens
    are the CPU engine's without speculation."""
    import revolta

    cpu, _ = pair
    d = Path(os.environ.get("REVOLTA_TEST_DATA", "/nonexistent")) / "qwen4exp" / (CASE + "-mtp")
    if not (d / "mtp.safetensors").exists():
        import tiny_mtp

        d = tmp_path_factory.mktemp(CASE + "-mtp")
        model = ref.make_checkpoint(CASE, d)
        tiny_mtp.add_random_mtp(model, d, seed=7, std=0.1, layer=tiny_mtp.qwen35_moe_layer(model.config))
    with revolta.LLM(str(d), device="cuda", gpu_memory_utilization=0.0, max_model_len=1024, dtype="float32",
                     kv_cache_dtype="float32", kv_cache_memory_bytes=64 << 20,
                     speculative_config={"method": "mtp", "num_speculative_tokens": 3}) as gpu:
        outs = gpu.generate(PROMPTS, greedy(GEN))
        s = gpu.engine.stats()
    assert s.spec_num_drafts > 0 and s.spec_num_accepted_tokens < s.spec_num_draft_tokens
    for p, out in zip(PROMPTS, outs):
        assert_greedy_until_near_tie(cpu.generate([p], greedy(GEN, True))[0], out, NEAR_TIE, GEN)


@pytest.mark.parametrize("ple_offload", ["host", "disk"])
def test_decode_graphs_give_the_eager_tokens(pair, tmp_path_factory, ple_offload):
    """Decode steps replay recorded graphs (PLE's gather a host stage in them, QSA on the runner's
    device metadata) and give the tokens of the same engine without graphs, from the table in
    host memory and in its file's mapping. (float16: float32 experts are grouped on the host, so
    a float32 step is never recorded.)"""
    import revolta

    d = checkpoint(tmp_path_factory)
    common = dict(device="cuda", gpu_memory_utilization=0.0, max_model_len=1024, kv_cache_memory_bytes=64 << 20,
                  max_num_seqs=8, ple_offload=ple_offload)
    outs, replays = {}, {}
    for eager in (True, False):
        with revolta.LLM(d, enforce_eager=eager, **common) as llm:
            outs[eager] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy(GEN))]
            replays[eager] = llm.engine.stats().graph_replays
    assert replays[True] == 0 and replays[False] >= GEN - 2
    assert outs[False] == outs[True]
