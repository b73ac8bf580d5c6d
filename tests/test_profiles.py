"""Every launch profile in configs/profiles resolves, passes the startup checks and answers a chat
request on a tiny model of the architecture it is for: the reference deployment's (an AWQ
Qwen3-Next with an MTP head, 4 tensor-parallel ranks, MTP drafts, an E4M3 KV cache with a host
tier, the qwen3 parsers) on CPU ranks. Only what a test machine forces is set over a profile: the
model, the CPU for a CUDA profile, the context length the tiny model allows, memory sizes. The
startup log names what the profile set and what was set over it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from conftest import make_hf_model, with_qwen_markers
from revolta.profiles import available_profiles, load_profile, profile_line, resolve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from qwen4exp_reference import write_tokenizer  # noqa: E402

# TP4-shardable hybrid MoE whose expert rows stay whole int4 blocks on each rank.
HYBRID = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=128, num_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=512, shared_expert_intermediate_size=512,
              linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=64,
              num_hidden_layers=4, max_position_embeddings=1024, vocab_size=320)


def tiny_model(profile: str, root: Path) -> Path | None:
    """A checkpoint of the profile's kind (None: the profile's own model, the demo)."""
    if profile == "cpu-demo":
        return None
    d = root / profile
    if profile == "sm70-tp4-awq-mtp":
        import tiny_mtp
        from revolta.quantize import quantize_awq

        src = root / (profile + "-f32")
        model = make_hf_model("qwen3_next", src, seed=3, **HYBRID)
        tiny_mtp.add_random_mtp(model, src, seed=4)
        quantize_awq(src, d, group=32)
        for f in src.glob("*mtp*"):
            if not (d / f.name).exists():
                (d / f.name).write_bytes(f.read_bytes())
    else:
        make_hf_model("llama" if profile.startswith("cpu") else "qwen3", d, seed=2, vocab_size=320,
                      max_position_embeddings=1024)
    write_tokenizer(d, 320)
    with_qwen_markers(d)
    return d


def overrides(profile: str, model: Path | None) -> dict:
    values = load_profile(profile)
    out = {"port": 0}
    if model is not None:
        out.update(model=str(model), max_model_len=1024)
    if values.get("device") == "cuda":
        out.update(device="cpu", kv_cache_memory_bytes=32 << 20)
    if values.get("kv_offloading_size"):
        out["kv_offloading_size"] = 0.05
    if values.get("kv_cache_memory_bytes", 0) > 256 << 20:  # (a test machine's memory)
        out["kv_cache_memory_bytes"] = 256 << 20
    return out


def test_every_profile_is_tested():
    assert {"cpu-demo", "cpu-large", "sm70-tp2-fp16", "sm70-tp4-awq-mtp"} <= set(available_profiles())


@pytest.mark.parametrize("profile", available_profiles())
def test_profile_starts_and_answers(profile, tmp_path, caplog):
    from revolta.server.cli import build

    model = tiny_model(profile, tmp_path)
    cli = overrides(profile, model)
    settings, report = resolve(cli, profile)
    line = profile_line(profile, report)
    mine = load_profile(profile)
    for k, v in mine.items():  # every value the profile sets is in force, or reported as set over it
        assert report[k]["source"] == f"profile:{profile}" or k in cli, (k, report[k])
    assert all(f"{k}=" in line for k in mine)
    with caplog.at_level(logging.INFO):
        app, engine = build(settings)
    try:
        info = engine.model_info
        assert info.tensor_parallel_size == mine.get("tensor_parallel_size", 1)
        if "quantization" in mine:
            assert mine["quantization"] in info.quantization
        with TestClient(app) as client:
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                                                          "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] >= 1
    finally:
        engine.shutdown()
