"""AWQ 4-bit weights (AutoAWQ GEMM layout) against the format's published dequantization, written
here from its description (unpack the 8 nibbles of each int32 column-wise, undo AWQ's interleave
[0, 2, 4, 6, 1, 3, 5, 7], w = (q - zero) * scale, transposed to [out, in]), and a tiny Llama / Qwen3
quantized by `revolta quantize --awq` against HF transformers running the dequantized weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import make_hf_model
from quant_checks import assert_matches_hf, with_quantization_config
from revolta import LLM, SamplingParams, _core
from revolta.cli import main as revolta_cli
from revolta.models.safetensors_io import read_safetensors
from revolta.quantize import quantize_matrix

REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # column j of a run of 8 sits in nibble REVERSE_ORDER[j]


def unpack(packed: np.ndarray) -> np.ndarray:
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    nibbles = (packed.astype(np.uint32)[:, :, None] >> shifts) & 0xF  # [R, C, 8] in storage order
    return nibbles[:, :, REVERSE_ORDER].reshape(packed.shape[0], -1)


def awq_dequantize(qweight, qzeros, scales) -> np.ndarray:
    """The [N, K] float weight an AWQ triple stands for."""
    group = qweight.shape[0] // scales.shape[0]
    iw, iz = unpack(qweight), unpack(qzeros)
    zeros = np.repeat(iz, group, axis=0)
    s = np.repeat(scales.astype(np.float32), group, axis=0)
    return ((iw.astype(np.float32) - zeros) * s).T


def random_awq(n: int, k: int, group: int, rng):
    qweight = rng.integers(-(2**31), 2**31, size=(k, n // 8), dtype=np.int64).astype(np.int32)
    qzeros = rng.integers(-(2**31), 2**31, size=(k // group, n // 8), dtype=np.int64).astype(np.int32)
    scales = rng.uniform(0.001, 0.05, size=(k // group, n)).astype(np.float16)
    return qweight, qzeros, scales


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("m", [1, 5, 40])
def test_linear_over_repacked_awq_matches_the_published_dequantization(group, m):
    rng = np.random.default_rng(group + m)
    n, k = 48, 1024
    qweight, qzeros, scales = random_awq(n, k, group, rng)
    raw, dtype = _core.ops.repack_awq(qweight, qzeros, scales.view(np.uint16))
    assert dtype == f"int4_g{group}" and raw.shape == (n, k // group * (4 + group // 2))  # 4 groups a block
    w = awq_dequantize(qweight, qzeros, scales)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = np.zeros((m, n), dtype=np.float32)
    _core.ops.linear_quantized(x, raw, dtype, out)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("group", [32, 128])
def test_round_to_nearest_stays_within_half_a_step(group):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    packed = quantize_matrix(w, group)
    back = awq_dequantize(packed["qweight"], packed["qzeros"], packed["scales"])
    step = np.repeat(packed["scales"].astype(np.float32).T, group, axis=1)
    assert np.all(np.abs(back - w) <= 0.5 * step + 1e-6)
    assert np.abs(back - w).mean() > 0  # it did quantize


def dequantized_hf_model(model, awq_dir):
    """The HF model with every quantized projection replaced by its published dequantization."""
    tensors = {}
    for f in awq_dir.glob("*.safetensors"):
        tensors.update(read_safetensors(f))
    replaced = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = name[: -len(".weight")]
            if f"{base}.qweight" in tensors:
                w = awq_dequantize(tensors[f"{base}.qweight"], tensors[f"{base}.qzeros"], tensors[f"{base}.scales"])
                p.copy_(torch.from_numpy(np.ascontiguousarray(w)))
                replaced += 1
    assert replaced > 0
    return model


# Rows of 4-bit blocks hold four groups: K a multiple of 128 (g32) or 512 (g128). The first case's
# projections (K = 64, 96) are not, and are held dequantized.
CASES = {
    "llama-g32-unblocked": ("llama", 32, {}),
    "llama-g32": ("llama", 32, dict(hidden_size=128, intermediate_size=256)),
    "qwen3-g128": ("qwen3", 128, dict(hidden_size=512, intermediate_size=1024, head_dim=128)),
}


@pytest.fixture(scope="module", params=list(CASES))
def awq_case(request, tmp_path_factory):
    kind, group, overrides = CASES[request.param]
    src = tmp_path_factory.mktemp(f"{request.param}-f32")
    model = make_hf_model(kind, src, seed=3, **overrides)
    out = tmp_path_factory.mktemp(request.param)
    assert revolta_cli(["quantize", "--model", str(src), "--awq", "--group-size", str(group), str(out)]) == 0
    return dequantized_hf_model(model, out), out, group


def test_awq_checkpoint_matches_hf_on_its_dequantized_weights(awq_case):
    model, path, group = awq_case
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "awq" and cfg["group_size"] == group
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 256, size=n).tolist() for n in (6, 23, 41)]
    with LLM(str(path), kv_cache_memory_bytes=8 << 20) as llm:
        assert llm.model_info.quantization == f"awq int4 g{group}"
        assert_matches_hf(llm, model, prompts, 16)


def test_weights_are_held_in_four_bits(awq_case):
    """The engine's weight bytes: the projections at half a byte a value plus 4 bytes a group, the
    embedding and head in float32 (as the same model reports with load_format dummy, which
    makes up weights of the checkpoint's own format)."""
    model, path, group = awq_case
    tensors = {}
    for f in path.glob("*.safetensors"):
        tensors.update(read_safetensors(f))
    packed = [t for n, t in tensors.items() if n.endswith(".qweight")]
    assert packed
    blocked = sum(t.size * 8 for t in packed if t.shape[0] % (4 * group) == 0)
    unblocked = sum(t.size * 8 for t in packed if t.shape[0] % (4 * group) != 0)  # held dequantized (float32)
    unquantized = sum(t.size for n, t in tensors.items() if n.endswith("_proj.weight"))  # K not a whole group
    heads = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" in n or "lm_head" in n)
    expected = blocked // 2 + blocked // group * 4 + (unblocked + unquantized + heads) * 4
    with LLM(str(path), kv_cache_memory_bytes=8 << 20) as llm:
        assert llm.model_info.quantization == f"awq int4 g{group}"
        assert llm.model_info.weight_bytes == expected
    if unblocked == 0:  # dummy weights of the checkpoint's format take the same bytes
        with LLM(str(path), kv_cache_memory_bytes=8 << 20, load_format="dummy") as llm:
            assert llm.model_info.weight_bytes == expected


def test_unsupported_quantization_configs_are_refused_naming_the_field(awq_case, tmp_path):
    _, path, _ = awq_case
    for field, value, message in [
        ("quant_method", "gptq", "quant_method 'gptq' is not supported"),
        ("group_size", 64, "group_size 64 is not supported"),
        ("bits", 8, "bits 8"),
    ]:
        bad = with_quantization_config(path, tmp_path / f"{field}-{value}", lambda q: {**q, field: value})
        with pytest.raises(Exception, match=message):
            LLM(str(bad), kv_cache_memory_bytes=8 << 20)


def test_quantization_awq_needs_an_awq_checkpoint(tmp_path):
    make_hf_model("llama", tmp_path, seed=1, hidden_size=512, intermediate_size=1024)
    with pytest.raises(ValueError, match="quantization .awq.*no awq quantization_config"):
        LLM(str(tmp_path), kv_cache_memory_bytes=8 << 20, quantization="awq")
    with LLM(str(tmp_path), kv_cache_memory_bytes=8 << 20, load_format="dummy") as llm:
        full = llm.model_info.weight_bytes
    with LLM(str(tmp_path), kv_cache_memory_bytes=8 << 20, load_format="dummy", quantization="awq") as llm:
        assert llm.model_info.quantization == "awq int4 g128"
        assert llm.model_info.weight_bytes < 0.75 * full  # the embedding and head stay float32
        out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 4
