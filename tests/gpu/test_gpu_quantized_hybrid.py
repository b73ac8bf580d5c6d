"""A quantized Qwen3-Next on the GPU against the CPU engine (float16) on the same checkpoint (a tiny model
made by `revolta quantize --awq`, experts per expert as AWQ checkpoints hold them): 4-bit routed and
shared experts through the decode kernels (one request, and eight at once in decode graphs) and
through the f16 copies of the grouped prefill (prompts past 64 tokens); every step's logits close
and greedy tokens equal up to a CPU near-tie."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import first_divergence_on_near_tie, make_hf_model
from quant_checks import awq_cpu_and_gpu, token_prompts
from test_quantized_hybrid import CONFIG, per_expert

pytestmark = pytest.mark.gpu

# g128 blocks hold 512 values: hidden and expert sizes of whole blocks
SIZES = {32: {}, 128: dict(hidden_size=512, moe_intermediate_size=512, shared_expert_intermediate_size=512)}


@pytest.fixture(scope="module", params=[32, 128], ids=["g32", "g128"])
def pair(request, tmp_path_factory):
    group = request.param
    src, out = tmp_path_factory.mktemp("next-f32"), tmp_path_factory.mktemp(f"next-awq-g{group}")
    make_hf_model("qwen3_next", src, seed=8, max_position_embeddings=1024, **{**CONFIG, **SIZES[group]})
    per_expert(src)
    yield from awq_cpu_and_gpu(src, out, group, "float16")


def prompts(n):
    return token_prompts(n, 12)


def test_quantized_experts_match_cpu(pair):
    import revolta

    cpu, gpu = pair
    sp = revolta.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, return_generation_logits=True)
    ps = prompts(8)
    ref = cpu.generate(ps, sp)
    # Every step's logits close up to where the tokens part, which must be a near-tie within twice
    # that tolerance (both sides may move by it). The CPU holds the 16-bit weights as the GPU does;
    # the GPU's f16 activations and KV still drift over the steps (CPU float16 against float32 on
    # these models: up to 0.006 (1 + max |logit|)), a wrong expert or group moves logits by O(1).
    ties = []
    for p, c in zip(ps[:4], ref):  # prompts of 5 and 17 tokens decode-sized, 130 and 300 grouped
        g = gpu.generate([p], sp)[0]
        lcs, lgs = c.outputs[0].generation_logits, g.outputs[0].generation_logits
        tol = 2e-2 * (1 + float(np.max(np.abs(np.asarray(lcs[0])))))
        ties.append(2 * tol)
        ids_c, ids_g = c.outputs[0].token_ids, g.outputs[0].token_ids
        same = next((i for i, (a, b) in enumerate(zip(ids_c, ids_g)) if a != b), len(ids_c))
        for lc, lg in zip(lcs[: same + 1], lgs[: same + 1]):
            assert np.max(np.abs(np.asarray(lc) - np.asarray(lg))) < tol
        if not first_divergence_on_near_tie(ids_c, ids_g, lcs, 2 * tol):
            assert len(ids_c) == len(ids_g)
    before = gpu.engine.stats().graph_replays
    batch = gpu.generate(ps, revolta.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert gpu.engine.stats().graph_replays > before
    for c, g in zip(ref, batch):
        if not first_divergence_on_near_tie(c.outputs[0].token_ids, g.outputs[0].token_ids, c.outputs[0].generation_logits, max(ties)):
            assert c.outputs[0].token_ids == g.outputs[0].token_ids
