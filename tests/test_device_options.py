"""Device-related options on a CPU-only build: dummy weights, clear startup errors."""

from __future__ import annotations

import pytest

from conftest import make_hf_model


@pytest.fixture(scope="module")
def tiny_dir(tiny_llama_dir):
    return tiny_llama_dir


def test_dummy_weights_are_deterministic_and_not_the_checkpoint(tiny_dir):
    import revolta

    sp = revolta.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    p = [{"prompt_token_ids": [5, 17, 33, 9]}]
    a = revolta.LLM(tiny_dir, load_format="dummy").generate(p, sp)[0].outputs[0].token_ids
    b = revolta.LLM(tiny_dir, load_format="dummy").generate(p, sp)[0].outputs[0].token_ids
    real = revolta.LLM(tiny_dir).generate(p, sp)[0].outputs[0].token_ids
    assert a == b and len(a) == 8
    assert a != real


def test_cuda_requests_fail_at_startup_naming_the_option(tiny_dir):
    import revolta

    with pytest.raises(ValueError, match="device 'cuda'"):
        revolta.LLM(tiny_dir, device="cuda")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        revolta.LLM(tiny_dir, kv_cache_dtype="bfloat16")
    with pytest.raises(ValueError, match="load_format"):
        revolta.LLM(tiny_dir, load_format="pt")
    with pytest.raises(ValueError, match="async_scheduling must be auto, on or off"):
        revolta.LLM(tiny_dir, async_scheduling="always")


def test_dummy_weights_for_a_hybrid_model(tmp_path):
    import revolta

    d = tmp_path / "next"
    make_hf_model("qwen3_next", d)
    sp = revolta.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    p = [{"prompt_token_ids": [5, 17, 33, 9, 2, 40]}]
    a = revolta.LLM(str(d), load_format="dummy").generate(p, sp)[0].outputs[0].token_ids
    b = revolta.LLM(str(d), load_format="dummy").generate(p, sp)[0].outputs[0].token_ids
    assert a == b and len(a) == 6
