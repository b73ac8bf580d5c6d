"""Sleep mode on the GPU (`pytest -m gpu`): level 1 gives the device the KV pool and the CUDA
graphs' memory back, level 2 the weights too (measured by the device's free memory); after wake_up
the graphs are recorded again and greedy tokens are those before sleep, dense and hybrid
(DeltaNet state slots) alike."""

from __future__ import annotations

import pytest

from conftest import make_hf_model

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 17, 99, 3, 250, 41, 7], [1, 77] * 9, [9, 8, 7]]


def free_bytes() -> int:
    import torch

    return torch.cuda.mem_get_info()[0]


@pytest.mark.parametrize("kind", ["llama", "qwen3_next"])
def test_sleep_gives_device_memory_back_and_wakes_up_the_same(tmp_path, kind):
    import revolta

    big = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4) if kind == "llama" else {}
    make_hf_model(kind, tmp_path, seed=3, **big)
    greedy = revolta.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm = revolta.LLM(str(tmp_path), device="cuda", max_model_len=256, gpu_memory_utilization=0.0,
                      kv_cache_memory_bytes=2 << 30)
    try:
        kv, weights = llm.model_info.kv_cache_bytes, llm.model_info.weight_bytes
        want = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy)]
        replays = llm.stats().graph_replays
        assert replays > 0
        awake = free_bytes()
        llm.sleep(1)
        level1 = free_bytes()
        assert level1 - awake > 0.95 * kv, (level1 - awake, kv)
        llm.wake_up()
        assert level1 - free_bytes() > 0.95 * kv  # the pool is back (the allocator's cache from startup is not)
        got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy)]
        assert got == want and llm.stats().graph_replays > replays  # graphs recorded again, counters go on
        awake = free_bytes()
        llm.sleep(2)
        assert free_bytes() - awake > 0.95 * kv + 0.9 * weights, (free_bytes() - awake, kv, weights)
        llm.wake_up()
        got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy)]
        assert got == want
    finally:
        llm.shutdown()
