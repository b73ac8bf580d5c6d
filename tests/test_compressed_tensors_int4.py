"""compressed-tensors int4 (`pack-quantized` W4A16) checkpoints, written by the compressed-tensors
package's own compressor from a tiny random model and decompressed by it for the reference: the
engine (which reads them as AWQ's layout) gives logits within 2e-3 of transformers running the
package's dequantised weights, for symmetric and asymmetric groups of 32, per-channel scales, and
an `ignore` list that keeps layers in 16 bits. Activation order is refused, naming it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from safetensors.torch import load_file, save_file

from conftest import make_hf_model
from revolta import LLM

PROMPT = [5, 17, 99, 3, 42, 8, 61, 200, 7]
# Routed and shared experts (per-expert linears, as llm-compressor writes them) of a width whose rows
# are whole int4 blocks, so that they stay int4 in the engine.
HYBRID = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=4,
              num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=128)


def quant_params(w: torch.Tensor, args: QuantizationArgs):
    """Min / max scales (and zero points when asymmetric) per group or channel, as an observer sets them."""
    n, k = w.shape
    group = args.group_size if args.strategy == "group" else k
    g = w.float().reshape(n, k // group, group)
    if args.symmetric:
        scale = g.abs().amax(-1) / 7.5
        return scale.clamp_min(1e-6).half(), None
    lo, hi = g.amin(-1).clamp_max(0), g.amax(-1).clamp_min(0)
    scale = ((hi - lo) / 15).clamp_min(1e-6)
    zero = (-8 - torch.round(lo / scale)).clamp(-8, 7).to(torch.int8)
    return scale.half(), zero


def write_checkpoint(path, args: QuantizationArgs, ignore: list[str]):
    """Each decoder projection compressed by the package (the ignored layers' left in 16 bits);
    returns the dense weights the package decompresses them to."""
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    tensors = load_file(str(path / "model.safetensors"))
    dense, out = {}, {}
    for name, w in tensors.items():
        base = name[: -len(".weight")]
        if not (name.startswith("model.layers.") and name.endswith("_proj.weight")) or any(i in base for i in ignore):
            out[name] = w
            continue
        scale, zero = quant_params(w, args)
        state = {"weight": w.float(), "weight_scale": scale}
        if zero is not None:
            state["weight_zero_point"] = zero
        packed = PackedQuantizationCompressor.compress(state, scheme)
        out.update({f"{base}.{k}": v for k, v in packed.items()})
        dense[name] = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"].float()
    save_file(out, str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": args.model_dump(mode="json"),
                                      "input_activations": None, "output_activations": None}},
        "ignore": ["lm_head"] + ignore}
    (path / "config.json").write_text(json.dumps(config))
    return dense


@pytest.mark.parametrize("kind,args,ignore", [
    ("qwen3", QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32), []),
    ("llama", QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32), ["layers.1.mlp"]),
    ("qwen3", QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="channel"), ["self_attn.o_proj"]),
    ("qwen3_next", QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32), []),
])
def test_logits_match_the_packages_dequantised_model(tmp_path, kind, args, ignore, monkeypatch):
    monkeypatch.setenv("REVOLTA_CACHE_DIR", str(tmp_path / "cache"))
    make_hf_model(kind, tmp_path / "m", seed=7, **(HYBRID if kind == "qwen3_next" else {}))
    shutil.copytree(tmp_path / "m", tmp_path / "ref")
    dense = write_checkpoint(tmp_path / "m", args, ignore)
    assert dense and any(i in n for n in load_file(str(tmp_path / "m" / "model.safetensors")) for i in ignore or ["."])
    # The reference: the same checkpoint with the package's dequantised weights, as transformers loads it.
    state = load_file(str(tmp_path / "ref" / "model.safetensors"))
    state.update({n: w.to(state[n].dtype) for n, w in dense.items()})
    save_file(state, str(tmp_path / "ref" / "model.safetensors"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ref"), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT]), use_cache=False).logits[0, -1].float()
    with LLM(str(tmp_path / "m"), max_model_len=64) as llm:
        assert "awq" in llm.model_info.quantization
        from revolta import SamplingParams

        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, return_generation_logits=True))
        ours = torch.tensor(out[0].outputs[0].generation_logits[0])
    assert torch.allclose(ours, ref, atol=2e-3), (ours - ref).abs().max()
    plain = make_hf_model(kind, tmp_path / "p", seed=7, **(HYBRID if kind == "qwen3_next" else {}))  # (the check can fail: quantising moved the logits)
    with torch.no_grad():
        assert (plain(torch.tensor([PROMPT]), use_cache=False).logits[0, -1] - ref).abs().max() > 1e-2


def test_activation_order_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("REVOLTA_CACHE_DIR", str(tmp_path / "cache"))
    make_hf_model("llama", tmp_path / "m")
    write_checkpoint(tmp_path / "m", QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                                                      group_size=32), [])
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="activation order"):
        LLM(str(tmp_path / "m"))
