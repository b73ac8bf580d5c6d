"""The engine's own GGUF reader and block dequantization (quant/) against the `gguf` package:
random blocks of every format the engine reads, written by gguf's writer, and every tensor of
the real SmolLM2 demo file; a truncated file is an error naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from revolta import _core

# Byte offsets of each block's f16 scale fields (random bytes there could be NaN or huge).
SCALES = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q8_0: [0], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
FORMATS = [Q.F32, Q.F16, Q.BF16, *SCALES]


def random_blocks(qtype, rows: int, cols: int, rng) -> np.ndarray:
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal((rows, cols)).astype(np.float32)
    if qtype == Q.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16)
    raw = rng.integers(0, 256, size=(rows, cols // block_values, block_bytes), dtype=np.uint8)
    if qtype == Q.BF16:
        raw[..., 1] = rng.integers(0x3c, 0x40, size=raw.shape[:-1])  # exponents of moderate values
    for at in SCALES.get(qtype, []):
        raw[..., at:at + 2] = rng.uniform(-0.5, 0.5, size=raw.shape[:-1] + (1,)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def write(path: Path, tensors: dict) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (qtype, data) in tensors.items():
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_every_format_matches_the_gguf_package(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {f"t.{q.name}": (q, random_blocks(q, 3, 512, rng)) for q in FORMATS}
    path = tmp_path / "blocks.gguf"
    write(path, tensors)
    listed = {name: (kind, tuple(shape)) for name, kind, shape, _ in _core.gguf.tensors(str(path))}
    reference = gguf.GGUFReader(str(path))
    for t in reference.tensors:
        qtype = Q(t.tensor_type)
        assert listed[t.name] == (qtype.name, (3, 512)), t.name
        want = gguf.quants.dequantize(np.asarray(t.data), qtype).reshape(3, 512).astype(np.float32)
        got = _core.gguf.dequantize(str(path), t.name)
        assert got.shape == (3, 512) and np.isfinite(want).all()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()), err_msg=t.name)


def test_the_demo_file_matches_the_gguf_package():
    from revolta.models.resolve import demo_gguf

    path = str(demo_gguf())
    reference = gguf.GGUFReader(path)
    listed = {name: kind for name, kind, _, _ in _core.gguf.tensors(path)}
    assert len(listed) == len(reference.tensors) and "Q4_1" in listed.values()
    for t in reference.tensors:
        want = gguf.quants.dequantize(np.asarray(t.data), Q(t.tensor_type)).astype(np.float32)
        got = _core.gguf.dequantize(path, t.name)
        assert got.size == want.size, t.name
        np.testing.assert_allclose(got.reshape(-1), want.reshape(-1), rtol=1e-6, atol=1e-7, err_msg=t.name)


def test_truncated_and_foreign_files_are_named(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "whole.gguf"
    write(path, {"w": (Q.Q4_K, random_blocks(Q.Q4_K, 4, 256, rng))})
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    with pytest.raises(RuntimeError, match=r"corrupt GGUF file .*cut\.gguf: tensor 'w' .* truncated"):
        _core.gguf.tensors(str(cut))
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:30])
    with pytest.raises(RuntimeError, match=r"corrupt GGUF file .*head\.gguf: truncated at byte"):
        _core.gguf.tensors(str(head))
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(RuntimeError, match="no GGUF magic"):
        _core.gguf.tensors(str(other))


INTEGER_DOT = {Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}  # decode-sized inputs: integer dot products


def quantized_activations(x: np.ndarray, bits: int) -> np.ndarray:
    """x as the integer-dot kernels see it: per 32 values, scale amax / 127, values rounded to
    the nearest multiple (ties to even), in float32 as the kernel computes them; with 16 bits
    each value's rounding residual too, in steps of 1 / 254."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = (np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    u = (blocks * inv).astype(np.float32)
    q = np.rint(u)
    if bits == 16:
        q = q + np.rint((u - q) * np.float32(254)) / 254
    return (q * d).reshape(x.shape)


@pytest.mark.parametrize("qtype", list(SCALES), ids=[q.name for q in SCALES])
def test_cpu_linear_and_embedding_over_blocks(qtype):
    """ops::linear with weights kept in their blocks (decode-sized and prefill-sized inputs, a row
    count that is not a multiple of the kernels' tiles) and ops::embedding rows from them, against
    numpy over the gguf package's dequantization (for the integer-dot formats at decode sizes,
    with the activations quantized as the kernel does)."""
    rng = np.random.default_rng(int(qtype))
    N, K = 37, 512
    raw = random_blocks(qtype, N, K, rng)
    w = gguf.quants.dequantize(raw, qtype).reshape(N, K).astype(np.float64)
    for M, bits in ((1, 8), (1, 16), (3, 8), (3, 16), (40, 8)):
        x = rng.standard_normal((M, K)).astype(np.float32)
        out = np.zeros((M, N), np.float32)
        _core.ops.linear_quantized(x, raw, qtype.name, out, activation_bits=bits)
        exact = x.astype(np.float64) @ w.T
        if qtype in INTEGER_DOT and M < 32:
            # The weights meet x in 8- or 16-bit blocks, Q4_1's minimums included (with the exact
            # sums of x they would no longer cancel the values' error).
            want = quantized_activations(x, bits).astype(np.float64) @ w.T
            if bits == 16:  # near the exact product too (8 bits: about 30x further off)
                np.testing.assert_allclose(out, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max(), err_msg=f"M={M}")
            else:
                assert np.abs(out - exact).max() > 1e-3 * np.abs(exact).max()
        else:
            want = exact
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=f"M={M}")
    ids = np.array([5, 0, 36, 5], np.int32)
    rows = np.zeros((4, K), np.float32)
    _core.ops.embedding_quantized(ids, raw, qtype.name, rows)
    np.testing.assert_allclose(rows, w[ids], rtol=1e-6, atol=1e-7)


def test_demo_read_in_place_with_blocks_kept():
    """The demo GGUF read by the engine itself (what load_format auto does on the CPU), its Q4_1 /
    Q8_0 matrices kept in their blocks (weights 96 MB instead of 538 MB), against the float32
    import (load_format safetensors). With 16-bit activations (the default) decode-sized steps stay
    near the import's logits; with 8 bits they move more (bounded here; top-1 kept on these prompts)."""
    from revolta import LLM, SamplingParams

    prompts = [{"prompt_token_ids": [1, 504, 3458, 282, 4649, 314]}, {"prompt_token_ids": list(range(100, 120))}]
    params = SamplingParams(temperature=0.0, max_tokens=1, return_generation_logits=True)
    logits, sizes, said = {}, {}, {}
    for name, kw in {"float32": dict(load_format="safetensors"), "16": {}, "8": dict(block_activation_bits=8)}.items():
        with LLM(None, max_model_len=256, kv_cache_memory_bytes=32 << 20, **kw) as llm:
            logits[name] = [np.asarray(o.outputs[0].generation_logits[0]) for o in llm.generate(prompts, params)]
            sizes[name], said[name] = llm.model_info.weight_bytes, llm.model_info.quantization
    assert said == {"float32": "", "16": "gguf blocks, 16-bit activations", "8": "gguf blocks, 8-bit activations"}
    assert sizes["16"] == sizes["8"] < 0.2 * sizes["float32"]
    for a, fine, coarse in zip(logits["float32"], logits["16"], logits["8"]):
        assert a.argmax() == fine.argmax() == coarse.argmax()
        assert np.abs(a - fine).max() < 0.05 and np.abs(a - coarse).max() < 3.0, (np.abs(a - fine).max(), np.abs(a - coarse).max())
        assert np.abs(a - coarse).max() > 5 * np.abs(a - fine).max()


def cpu_flags() -> set[str]:
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_block_kernels_picked_at_run_time(tmp_path):
    """The integer-dot kernels are chosen by what the processor reports (one build for every x86-64
    machine): the best variant by default, each lower one on request through REVOLTA_CPU_ISA (run
    here in subprocesses, each checked like the test above), and a variant the processor lacks
    refused with a message naming the ones it runs."""
    flags = cpu_flags()
    avx2 = {"avx2", "fma", "f16c"} <= flags
    runs = (["avx512-vnni"] if avx2 and {"avx512_vnni", "avx512vl", "avx512bw"} <= flags else []) + \
           (["avx-vnni"] if avx2 and "avx_vnni" in flags else []) + (["avx2"] if avx2 else []) + ["none"]
    assert _core.ops.block_kernels_isa() == runs[0]
    script = tmp_path / "check.py"
    script.write_text(
        "import sys, numpy as np, gguf\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_gguf_blocks import random_blocks, quantized_activations\n"
        "from revolta import _core\n"
        "print(_core.ops.block_kernels_isa())\n"
        "rng = np.random.default_rng(3)\n"
        "for qtype in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q4_K):\n"
        "    raw = random_blocks(qtype, 37, 512, rng)\n"
        "    w = gguf.quants.dequantize(raw, qtype).reshape(37, 512).astype(np.float64)\n"
        "    x = rng.standard_normal((3, 512)).astype(np.float32)\n"
        "    for bits in (8, 16):\n"
        "        out = np.zeros((3, 37), np.float32)\n"
        "        _core.ops.linear_quantized(x, raw, qtype.name, out, activation_bits=bits)\n"
        "        xs = x if _core.ops.block_kernels_isa() == 'none' else quantized_activations(x, bits)\n"
        "        want = xs.astype(np.float64) @ w.T\n"
        "        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())\n")
    for isa in runs:
        done = subprocess.run([sys.executable, str(script)], env={**os.environ, "REVOLTA_CPU_ISA": isa},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[0] == isa
    missing = next(v for v in ("avx512-vnni", "avx-vnni", "avx2") if v not in runs) if len(runs) < 4 else None
    if missing:
        done = subprocess.run([sys.executable, str(script)], env={**os.environ, "REVOLTA_CPU_ISA": missing},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and f"REVOLTA_CPU_ISA '{missing}'" in done.stderr and runs[0] in done.stderr
