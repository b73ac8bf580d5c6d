"""AWQ 4-bit weights on the GPU against the CPU engine on the same checkpoint (a tiny Llama made by
`revolta quantize --awq`): greedy tokens equal up to a CPU near-tie, first logits close, one
request and eight at once (decode GEMVs of 1..8 rows in graphs), and a prefill past 64 tokens
(the f16 copy and tensor-core tiles)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import first_divergence_on_near_tie, make_hf_model
from quant_checks import awq_cpu_and_gpu, token_prompts

pytestmark = pytest.mark.gpu

NEAR_TIE = 0.02


@pytest.fixture(scope="module", params=[32, 128], ids=["g32", "g128"])
def pair(request, tmp_path_factory):
    src, out = tmp_path_factory.mktemp("llama-f32"), tmp_path_factory.mktemp(f"llama-awq-g{request.param}")
    make_hf_model("llama", src, seed=5, hidden_size=512, intermediate_size=1024, max_position_embeddings=1024)
    yield from awq_cpu_and_gpu(src, out, request.param, "float32")


def prompts(n):
    return token_prompts(n, 11)


def test_awq_greedy_matches_cpu(pair):
    import revolta

    cpu, gpu = pair
    sp = revolta.SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, return_generation_logits=True)
    ps = prompts(8)
    ref = cpu.generate(ps, sp)
    for p, c in zip(ps[:4], ref):
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
