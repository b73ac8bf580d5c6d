"""Quantized hybrid MoE models on the CPU: a tiny Qwen3-Next whose experts (routed and shared),
dense and attention output projections are AWQ 4-bit (`revolta quantize --awq`) or FP8 with
128 x 128 block scales, against HF transformers running the dequantized weights. The checkpoint
holds its experts per expert (`experts.E.gate_proj.weight`), as quantized checkpoints do."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_hf_model
from quant_checks import assert_matches_hf
from revolta import LLM, SamplingParams
from revolta.cli import main as revolta_cli
from test_fp8 import dequantized, to_fp8

CONFIG = dict(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)


def per_expert(path) -> None:
    """Rewrites transformers' fused expert tensors ([E, 2I, H] gate_up, [E, H, I] down) per expert."""
    tensors = load_file(str(path / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("experts.gate_up_proj")]:
        base = name[: -len("gate_up_proj")]
        gate_up, down = tensors.pop(name), tensors.pop(base + "down_proj")
        inter = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            tensors[f"{base}{e}.gate_proj.weight"] = gate_up[e, :inter].contiguous()
            tensors[f"{base}{e}.up_proj.weight"] = gate_up[e, inter:].contiguous()
            tensors[f"{base}{e}.down_proj.weight"] = down[e].contiguous()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def load_per_expert(model, weights: dict[str, torch.Tensor]) -> None:
    """Copies per-expert float weights into the HF model's fused expert parameters."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if name.endswith("experts.gate_up_proj"):
                base = name[: -len("gate_up_proj")]
                for e in range(p.shape[0]):
                    p[e].copy_(torch.cat([weights[f"{base}{e}.gate_proj.weight"], weights[f"{base}{e}.up_proj.weight"]]))
                    params[base + "down_proj"][e].copy_(weights[f"{base}{e}.down_proj.weight"])
            elif name in weights:
                p.copy_(weights[name])


def awq_model(tmp_path):
    src, out = tmp_path / "f32", tmp_path / "awq"
    model = make_hf_model("qwen3_next", src, seed=8, **CONFIG)
    per_expert(src)
    assert revolta_cli(["quantize", "--model", str(src), "--awq", "--group-size", "32", str(out)]) == 0
    from revolta.models.safetensors_io import read_safetensors
    from test_awq import awq_dequantize

    t = read_safetensors(out / "model.safetensors")
    weights = {n[: -len(".qweight")] + ".weight": torch.from_numpy(np.ascontiguousarray(
        awq_dequantize(t[n], t[n[: -len("qweight")] + "qzeros"], t[n[: -len("qweight")] + "scales"])))
        for n in t if n.endswith(".qweight")}
    load_per_expert(model, weights)
    return model, out


def fp8_model(tmp_path):
    path = tmp_path / "fp8"
    model = make_hf_model("qwen3_next", path, seed=8, **CONFIG)
    per_expert(path)
    tensors = load_file(str(path / "model.safetensors"))
    weights = {}
    for name in [n for n in tensors if n.startswith("model.layers.") and n.endswith("_proj.weight") and tensors[n].dim() == 2]:
        q, scale = to_fp8(tensors[name].float(), "block")
        tensors[name], tensors[name[: -len(".weight")] + ".weight_scale_inv"] = q, scale
        weights[name] = dequantized(q, scale, "block")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (path / "config.json").write_text(json.dumps(cfg))
    load_per_expert(model, weights)
    return model, path


@pytest.mark.parametrize("make", [awq_model, fp8_model], ids=["awq-g32", "fp8-block"])
def test_quantized_qwen3_next_matches_hf_on_its_dequantized_weights(make, tmp_path):
    model, path = make(tmp_path)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 256, size=n).tolist() for n in (9, 70)]  # one longer than a DeltaNet chunk
    with LLM(str(path), kv_cache_memory_bytes=16 << 20) as llm:
        assert llm.model_info.quantization
        assert_matches_hf(llm, model, prompts, 10)
        quantized_bytes = llm.model_info.weight_bytes
    # The experts are held quantized: in float32 they alone would take 4 bytes a value.
    experts = sum(p.numel() for n, p in model.named_parameters() if "experts" in n)
    assert quantized_bytes < sum(p.numel() for p in model.parameters()) * 4 - experts * 2
    with LLM(str(path), kv_cache_memory_bytes=16 << 20, load_format="dummy") as llm:  # made up in its own format
        assert llm.model_info.weight_bytes < 1.05 * quantized_bytes  # the experts too, not a fused f32 tensor
        out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 3
