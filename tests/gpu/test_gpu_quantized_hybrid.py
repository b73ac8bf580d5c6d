"""A quantized Qwen3-Next on the GPU against the CPU engine on the same checkpoint (a tiny model
made by `revolta quantize --awq`, experts per expert as AWQ checkpoints hold them): 4-bit routed and
shared experts through the decode kernels (one request, and eight at once in decode graphs) and
through the f16 copies of the grouped prefill (prompts past 64 tokens); greedy tokens equal up to a
CPU near-tie, first logits close."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

from conftest import first_divergence_on_near_tie, make_hf_model
from revolta.cli import main as revolta_cli
from test_quantized_hybrid import CONFIG, per_expert

pytestmark = pytest.mark.gpu

NEAR_TIE = 0.02
# g128 blocks hold 512 values: hidden and expert sizes of whole blocks
SIZES = {32: {}, 128: dict(hidden_size=512, moe_intermediate_size=512, shared_expert_intermediate_size=512)}


@pytest.fixture(scope="module", params=[32, 128], ids=["g32", "g128"])
def pair(request, tmp_path_factory):
    import revolta

    group = request.param
    src, out = tmp_path_factory.mktemp("next-f32"), tmp_path_factory.mktemp(f"next-awq-g{group}")
    make_hf_model("qwen3_next", src, seed=8, max_position_embeddings=1024, **{**CONFIG, **SIZES[group]})
    per_expert(src)
    assert revolta_cli(["quantize", "--model", str(src), "--awq", "--group-size", str(group), str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["quantization_config"]["group_size"] == group
    cpu = revolta.LLM(str(out), dtype="float32", max_model_len=1024, max_num_seqs=16)
    gpu = revolta.LLM(str(out), device="cuda", max_model_len=1024, gpu_memory_utilization=0.0, max_num_seqs=16)
    assert gpu.model_info.quantization == f"awq int4 g{group}"
    yield cpu, gpu
    cpu.engine.shutdown()
    gpu.engine.shutdown()
    del cpu, gpu
    gc.collect()


def prompts(n, lengths=(5, 17, 130, 300, 9, 33, 2, 70)):
    rng = np.random.default_rng(12)
    return [{"prompt_token_ids": rng.integers(3, 256, size=lengths[i % len(lengths)]).tolist()} for i in range(n)]


def test_quantized_experts_match_cpu(pair):
    import revolta

    cpu, gpu = pair
    sp = revolta.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, return_generation_logits=True)
    ps = prompts(8)
    ref = cpu.generate(ps, sp)
    for p, c in zip(ps[:4], ref):  # prompts of 5 and 17 tokens decode-sized, 130 and 300 grouped
        g = gpu.generate([p], sp)[0]
        lc, lg = np.asarray(c.outputs[0].generation_logits[0]), np.asarray(g.outputs[0].generation_logits[0])
        assert np.max(np.abs(lc - lg)) < 5e-3 * (1 + np.max(np.abs(lc))), np.max(np.abs(lc - lg))
        if not first_divergence_on_near_tie(c.outputs[0].token_ids, g.outputs[0].token_ids, c.outputs[0].generation_logits, NEAR_TIE):
            assert len(c.outputs[0].token_ids) == len(g.outputs[0].token_ids)
    before = gpu.engine.stats().graph_replays
    batch = gpu.generate(ps, revolta.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert gpu.engine.stats().graph_replays > before
    for c, g in zip(ref, batch):
        if not first_divergence_on_near_tie(c.outputs[0].token_ids, g.outputs[0].token_ids, c.outputs[0].generation_logits, NEAR_TIE):
            assert c.outputs[0].token_ids == g.outputs[0].token_ids
