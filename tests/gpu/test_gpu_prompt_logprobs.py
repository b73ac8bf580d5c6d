"""prompt_logprobs on the GPU (`pytest -m gpu`): the prompt positions' rows come off the device
after the sampled ones, across prefill chunks; each prompt token's logprob and top alternatives
follow the CPU engine's (float16 weights against float32: within 0.02)."""

from __future__ import annotations

import pytest

from conftest import make_hf_model

pytestmark = pytest.mark.gpu

IDS = [5, 17, 99, 3, 250, 41, 7, 7, 130, 12, 64, 9, 200, 33, 18, 77, 150, 102, 4, 8, 61, 90, 11]


def test_prompt_logprobs_on_the_gpu(tmp_path):
    import revolta

    make_hf_model("llama", tmp_path, seed=2, hidden_size=128)
    sp = revolta.SamplingParams(max_tokens=2, prompt_logprobs=2)
    got = {}
    for device in ("cpu", "cuda"):
        extra = {"gpu_memory_utilization": 0.0} if device == "cuda" else {}
        llm = revolta.LLM(str(tmp_path), device=device, max_model_len=128, max_num_batched_tokens=7, **extra)
        got[device] = llm.generate([{"prompt_token_ids": IDS}], sp)[0].prompt_logprobs
        llm.shutdown()
    cpu, gpu = got["cpu"], got["cuda"]
    assert gpu[0] is None and len(gpu) == len(IDS)
    for i in range(1, len(IDS)):
        assert abs(gpu[i][IDS[i]] - cpu[i][IDS[i]]) < 0.02, i
        shared = set(cpu[i]) & set(gpu[i])
        assert IDS[i] in shared and len(shared) >= 2
