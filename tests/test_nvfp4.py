"""NVFP4 weights in ModelOpt's layout (E2M1 values two a byte, E4M3 scales per 16, a float32
global scale) against the OCP FP4 E2M1 value table and torch's float8_e4m3fn decoding of the
scales: tiny Llama / Qwen3 checkpoints against HF transformers running the dequantized weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_hf_model
from quant_checks import assert_matches_hf, projection_values, with_quantization_config
from revolta import LLM

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # OCP MX: magnitudes of codes 0..7; bit 3 the sign


def to_nvfp4(w: torch.Tensor):
    n, k = w.shape
    g = w.reshape(n, k // 16, 16)
    global_scale = (w.abs().max() / (6.0 * 448.0)).float()
    block = (g.abs().amax(-1) / 6.0 / global_scale).to(torch.float8_e4m3fn)
    scale = (block.float() * global_scale).clamp(min=1e-12)
    x = g / scale[..., None]
    code = (x.abs()[..., None] - E2M1).abs().argmin(-1) | ((x < 0).long() << 3)
    codes = code.reshape(n, k).to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), block, global_scale


def from_nvfp4(packed: torch.Tensor, block: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    values = E2M1[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
    return values * block.float().repeat_interleave(16, dim=1) * global_scale


CASES = {
    "llama": ("llama", dict(hidden_size=128, intermediate_size=256)),
    "qwen3": ("qwen3", dict(hidden_size=128, intermediate_size=192, head_dim=32)),
    "llama-unaligned": ("llama", dict(hidden_size=64, intermediate_size=80)),  # K = 80: held dequantized
}


@pytest.fixture(scope="module", params=list(CASES))
def nvfp4_case(request, tmp_path_factory):
    kind, overrides = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    model = make_hf_model(kind, path, seed=6, **overrides)
    tensors = load_file(str(path / "model.safetensors"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.layers.") and name.endswith("_proj.weight"):
                packed, block, global_scale = to_nvfp4(p.detach().float())
                base = name[: -len(".weight")]
                tensors[name] = packed
                tensors[base + ".weight_scale"] = block
                tensors[base + ".weight_scale_2"] = global_scale.reshape(())
                tensors[base + ".input_scale"] = torch.tensor(1.0)
                p.copy_(from_nvfp4(packed, block, global_scale))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    (path / "config.json").write_text(json.dumps(cfg))
    return model, path


def test_nvfp4_checkpoint_matches_hf_on_its_dequantized_weights(nvfp4_case):
    model, path = nvfp4_case
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 256, size=n).tolist() for n in (5, 36)]
    with LLM(str(path), kv_cache_memory_bytes=8 << 20) as llm:
        assert llm.model_info.quantization.startswith("nvfp4")
        assert_matches_hf(llm, model, prompts, 12)


def test_nvfp4_weights_take_five_eighths_of_a_byte_a_value(nvfp4_case):
    model, path = nvfp4_case
    blocked, unblocked, heads = projection_values(model, 64)  # unblocked ones: held in float32
    with LLM(str(path), kv_cache_memory_bytes=8 << 20) as llm:
        assert llm.model_info.weight_bytes == blocked // 64 * 40 + (unblocked + heads) * 4


def test_other_modelopt_algorithms_are_refused(nvfp4_case, tmp_path):
    _, path = nvfp4_case
    bad = with_quantization_config(path, tmp_path / "w4a8", lambda q: {**q, "quant_algo": "W4A8_AWQ"})
    with pytest.raises(Exception, match="modelopt quant_algo 'W4A8_AWQ'"):
        LLM(str(bad), kv_cache_memory_bytes=8 << 20)
