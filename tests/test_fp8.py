"""FP8 E4M3 weights with their scales (HF's `fp8`: weight_scale_inv per 128 x 128 block;
compressed-tensors: weight_scale per output channel) against torch's own float8_e4m3fn decoding:
the engine's block decoder on every byte, and tiny Llama / Qwen3 checkpoints against HF
transformers running the dequantized weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import hf_last_logits, make_hf_model
from quant_checks import assert_matches_hf, projection_values, with_quantization_config
from revolta import LLM, SamplingParams, _core


def e4m3(codes: np.ndarray) -> np.ndarray:
    return torch.from_numpy(codes.astype(np.uint8)).view(torch.float8_e4m3fn).float().numpy()


@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_every_e4m3_code_decodes_as_torch_does(scale):
    codes = np.arange(256, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # the two NaN codes (a NaN would spread through the product)
    raw = np.zeros((2, 132), dtype=np.uint8)
    for row in range(2):
        raw[row, :4] = np.frombuffer(np.float32(scale).tobytes(), dtype=np.uint8)
        raw[row, 4:] = codes[row * 128:(row + 1) * 128]
    out = np.zeros((128, 2), dtype=np.float32)
    _core.ops.linear_quantized(np.eye(128, dtype=np.float32), raw, "float8_g128", out)
    np.testing.assert_array_equal(out.T.reshape(-1), e4m3(codes) * np.float32(scale))


def to_fp8(w: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 weight, float32 scales) with scales as the layout stores them."""
    n, k = w.shape
    if layout == "channel":
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 448.0
        return (w / scale).to(torch.float8_e4m3fn), scale.float()
    rows, cols = -(-n // 128), -(-k // 128)
    scale = torch.empty(rows, cols)
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            scale[i, j] = blk.abs().max().clamp(min=1e-8) / 448.0
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / scale[i, j]).to(torch.float8_e4m3fn)
    return q, scale


def dequantized(q: torch.Tensor, scale: torch.Tensor, layout: str) -> torch.Tensor:
    w = q.float()
    if layout == "channel":
        return w * scale
    full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[: w.shape[0], : w.shape[1]]
    return w * full


CASES = {
    "llama-block": ("llama", "block", dict(hidden_size=128, intermediate_size=256)),
    "qwen3-channel": ("qwen3", "channel", dict(hidden_size=256, intermediate_size=384, head_dim=64)),
    "llama-block-unaligned": ("llama", "block", {}),  # K = 64 / 96: held dequantized
}


@pytest.fixture(scope="module", params=list(CASES))
def fp8_case(request, tmp_path_factory):
    kind, layout, overrides = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    model = make_hf_model(kind, path, seed=4, **overrides)
    tensors = load_file(str(path / "model.safetensors"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.layers.") and name.endswith("_proj.weight"):
                q, scale = to_fp8(p.detach().float(), layout)
                tensors[name] = q
                tensors[name[: -len(".weight")] + (".weight_scale" if layout == "channel" else ".weight_scale_inv")] = scale
                p.copy_(dequantized(q, scale, layout))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    if layout == "channel":
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    else:
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    (path / "config.json").write_text(json.dumps(cfg))
    return model, path


def test_fp8_checkpoint_matches_hf_on_its_dequantized_weights(fp8_case):
    model, path = fp8_case
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 256, size=n).tolist() for n in (7, 40)]
    with LLM(str(path), kv_cache_memory_bytes=8 << 20) as llm:
        assert llm.model_info.quantization.startswith("fp8")
        assert_matches_hf(llm, model, prompts, 12)


def test_fp8_weights_take_a_byte_a_value(fp8_case):
    model, path = fp8_case
    blocked, unblocked, heads = projection_values(model, 128)  # unblocked ones: held in float32
    expected = blocked + blocked // 128 * 4 + (unblocked + heads) * 4
    with LLM(str(path), kv_cache_memory_bytes=8 << 20) as llm:
        assert llm.model_info.weight_bytes == expected


def test_other_compressed_tensors_formats_are_refused(fp8_case, tmp_path):
    _, path = fp8_case
    int4 = {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}
    bad = with_quantization_config(path, tmp_path / "int4", lambda _: int4)
    with pytest.raises(Exception, match="group 'group_0' \\(4-bit int\\), but no tensor is pack-quantized"):
        LLM(str(bad), kv_cache_memory_bytes=8 << 20)


@pytest.mark.parametrize("fmt, share", [("fp8", 0.6), ("nvfp4", 0.45)])
def test_dummy_weights_of_a_float_format(tmp_path, fmt, share):
    make_hf_model("llama", tmp_path, seed=1, hidden_size=128, intermediate_size=256)
    with LLM(str(tmp_path), kv_cache_memory_bytes=8 << 20, load_format="dummy") as llm:
        full = llm.model_info.weight_bytes
    with LLM(str(tmp_path), kv_cache_memory_bytes=8 << 20, load_format="dummy", quantization=fmt) as llm:
        assert llm.model_info.quantization.startswith(fmt)
        assert llm.model_info.weight_bytes < share * full
        out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 4


def test_revolta_quantize_fp8_checkpoint_matches_hf(tmp_path):
    """`revolta quantize --fp8`: its E4M3 codes, decoded by torch, and its block scales are what
    the engine computes with."""
    from revolta.cli import main as revolta_cli

    src, out = tmp_path / "f32", tmp_path / "fp8"
    model = make_hf_model("qwen3", src, seed=9, hidden_size=128, intermediate_size=256, head_dim=32)
    assert revolta_cli(["quantize", "--model", str(src), "--fp8", str(out)]) == 0
    tensors = load_file(str(out / "model.safetensors"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_proj.weight"):
                q, scale = tensors[name], tensors[name[: -len(".weight")] + ".weight_scale_inv"]
                assert q.dtype == torch.float8_e4m3fn
                w = dequantized(q, scale, "block")
                assert (w - p).abs().max() <= p.abs().max() / 8  # E4M3 keeps 3 mantissa bits
                p.copy_(w)
    prompt = list(range(10, 40))
    with LLM(str(out), kv_cache_memory_bytes=8 << 20) as llm:
        assert llm.model_info.quantization.startswith("fp8")
        o = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, return_generation_logits=True))[0]
    err = (torch.tensor(o.outputs[0].generation_logits[0]) - hf_last_logits(model, prompt)).abs().max().item()
    assert err < 1e-4, err
