"""prompt_logprobs (vLLM's): the log-probability of every prompt token given the ones before it,
with its top alternatives, against HF transformers' log-softmax on tiny random models; across
prefill chunks, with tensor parallelism, and never from the prefix cache (its positions would have
no logits)."""

from __future__ import annotations

import pytest

from conftest import make_hf_model, torch
from revolta import LLM, SamplingParams

IDS = [5, 17, 99, 3, 250, 41, 7, 7, 130, 12, 64, 9, 200, 33, 18, 77, 150, 102, 4, 8, 61, 90, 11]


@pytest.fixture(scope="module", params=["llama", "qwen3_next"])
def case(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    extra = {"num_hidden_layers": 4} if request.param == "qwen3_next" else {}  # DeltaNet and attention layers
    model = make_hf_model(request.param, d, seed=2, **extra)
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([IDS]), use_cache=False).logits[0].double(), -1)
    return str(d), ref


@pytest.mark.parametrize("tp", [1, 2])
def test_prompt_logprobs_follow_hf(case, tp):
    d, ref = case
    llm = LLM(d, max_model_len=128, max_num_batched_tokens=7, tensor_parallel_size=tp)  # chunks of 7
    try:
        outs = [llm.generate([{"prompt_token_ids": IDS}], SamplingParams(max_tokens=2, prompt_logprobs=3))[0]
                for _ in range(2)]
    finally:
        llm.shutdown()
    for out in outs:  # the second would hit the prefix cache, which such a request does not read
        assert out.num_cached_tokens == 0
        pl = out.prompt_logprobs
        assert len(pl) == len(IDS) and pl[0] is None
        for i in range(1, len(IDS)):
            assert abs(pl[i][IDS[i]] - float(ref[i - 1, IDS[i]])) < 1e-4, i
            top = torch.topk(ref[i - 1], 3)
            for t, lp in zip(top.indices.tolist(), top.values.tolist()):
                assert abs(pl[i][t] - lp) < 1e-4, (i, t)
            assert len(set(pl[i]) - set(top.indices.tolist())) <= 1  # the prompt token, if not among them


def test_prompt_logprobs_options():
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    assert SamplingParams().prompt_logprobs is None
