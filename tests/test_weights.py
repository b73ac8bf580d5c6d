"""Checkpoint formats: sharded safetensors with an index, f16/bf16 storage, dtype conversion."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import hf_greedy, hf_last_logits, make_hf_model
from revolta import LLM, SamplingParams

PROMPT = [9, 31, 4, 77, 120, 5, 6, 200, 13, 2, 99]


def engine_logits(path, **kw) -> torch.Tensor:
    with LLM(str(path), kv_cache_memory_bytes=4 << 20, **kw) as llm:
        out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=1, return_generation_logits=True))
        return torch.tensor(out[0].outputs[0].generation_logits[0]), llm.model_info.weight_dtype


def test_sharded_checkpoint_with_index(tmp_path):
    model = make_hf_model("qwen3", tmp_path / "src", seed=5)
    model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="60KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2  # really split into several files
    logits, _ = engine_logits(tmp_path / "sharded")
    assert (logits - hf_last_logits(model, PROMPT)).abs().max().item() < 1e-4
    with LLM(str(tmp_path / "sharded"), kv_cache_memory_bytes=4 << 20) as llm:
        got = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    assert got[0].outputs[0].token_ids == hf_greedy(model, PROMPT, 16)


@pytest.mark.parametrize("torch_dtype,name", [(torch.bfloat16, "bfloat16"), (torch.float16, "float16")])
def test_half_precision_checkpoints(tmp_path, torch_dtype, name):
    model = make_hf_model("llama", tmp_path / "src", seed=6)
    half = model.to(torch_dtype)
    half.save_pretrained(tmp_path / name, safe_serialization=True)
    # The reference: the same rounded weights, computed in float32 (as the CPU engine computes).
    ref_model = half.float()
    logits, stored = engine_logits(tmp_path / name)  # dtype=auto keeps the checkpoint's dtype
    assert stored == name
    assert (logits - hf_last_logits(ref_model, PROMPT)).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_converting_float32_weights_at_load(tmp_path, dtype):
    model = make_hf_model("llama", tmp_path / "m", seed=7)
    logits, stored = engine_logits(tmp_path / "m", dtype=dtype)
    assert stored == dtype
    torch_dtype = getattr(torch, dtype)
    with torch.no_grad():  # the engine rounds matrices to the storage dtype; norm weights stay float32
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(p.to(torch_dtype).float())
    ref = hf_last_logits(model, PROMPT)
    assert (logits - ref).abs().max().item() < 1e-4


def test_long_context_decode_attention_split_over_the_context(tmp_path):
    """Decode with a long context splits attention into context segments (merged softmax)."""
    model = make_hf_model("llama", tmp_path / "long", seed=8, max_position_embeddings=1024)
    prompt = [(i * 37) % 250 + 3 for i in range(700)]
    with LLM(str(tmp_path / "long"), kv_cache_memory_bytes=32 << 20, num_threads=2) as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, return_generation_logits=True))
    tokens = out[0].outputs[0].token_ids
    for step, row in enumerate(out[0].outputs[0].generation_logits):
        ref = hf_last_logits(model, prompt + tokens[:step])
        assert (torch.tensor(row) - ref).abs().max().item() < 1e-4, f"step {step}"
