"""`revolta quantize --awq | --fp8`: a model directory's linear layers to a quantized checkpoint.

AWQ: round-to-nearest with a scale and a zero point per group of 32 or 128 input columns (min /
max of the group), packed in the AutoAWQ GEMM layout (`qweight` / `qzeros` int32, 8 output columns
per word in AWQ's order, `scales` float16). It does not search activation-aware scales (AutoAWQ
does). FP8: E4M3 values with a float32 scale per 128 x 128 block (`weight_scale_inv`, HF's `fp8`
layout). Either is declared by a `quantization_config` in config.json, so that any reader of the
format takes it: the point is a real checkpoint of the format, for tests and for trying it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from revolta.models.safetensors_io import F8E4M3, read_safetensors, write_safetensors

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # word slot i holds column AWQ_ORDER[i] of each run of 8


def quantizable(name: str, shape: tuple[int, ...], group: int) -> bool:
    """The decoder layers' projections (not the embedding, head, norms or MoE routers)."""
    return (name.startswith("model.layers.") and name.endswith("_proj.weight") and len(shape) == 2
            and shape[0] % 8 == 0 and shape[1] % group == 0)


def pack_columns(values: np.ndarray) -> np.ndarray:
    """[R, N] 4-bit values to int32 [R, N / 8], column 8c + AWQ_ORDER[i] at bits 4i of word c."""
    v = values.astype(np.uint32).reshape(values.shape[0], -1, 8)
    word = np.zeros(v.shape[:2], dtype=np.uint32)
    for i, col in enumerate(AWQ_ORDER):
        word |= v[:, :, col] << np.uint32(4 * i)
    return word.view(np.int32)


def quantize_matrix(w: np.ndarray, group: int) -> dict[str, np.ndarray]:
    """A float [N, K] linear weight to AWQ's qweight [K, N / 8], qzeros [K / group, N / 8] and
    scales [K / group, N]."""
    n, k = w.shape
    g = w.astype(np.float32).reshape(n, k // group, group)
    lo, hi = g.min(axis=2), g.max(axis=2)
    scale = ((hi - lo) / 15.0).astype(np.float16)
    scale[scale == 0] = np.float16(1e-4)  # constant groups: any scale; the zero point holds the value
    s = scale.astype(np.float32)
    zero = np.clip(np.round(-lo / s), 0, 15)
    q = np.clip(np.round(g / s[:, :, None]) + zero[:, :, None], 0, 15).reshape(n, k)
    return {"qweight": pack_columns(q.T), "qzeros": pack_columns(zero.T), "scales": np.ascontiguousarray(scale.T)}


def _e4m3_table() -> np.ndarray:
    """The values of the positive finite E4M3 codes 0..126, ascending (OCP E4M3FN)."""
    codes = np.arange(127)
    exp, mant = codes >> 3, codes & 7
    return np.where(exp == 0, mant * 2.0**-9, (8 + mant) * 2.0 ** (exp - 10)).astype(np.float32)


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """float32 to E4M3 codes: the nearest value (clamped to +-448), the sign in bit 7."""
    table = _e4m3_table()
    a = np.minimum(np.abs(x), table[-1])
    hi = np.clip(np.searchsorted(table, a), 0, 126)
    lo = np.maximum(hi - 1, 0)
    code = np.where(a - table[lo] <= table[hi] - a, lo, hi).astype(np.uint8)
    return code | (np.signbit(x).astype(np.uint8) << 7)


def quantize_fp8_matrix(w: np.ndarray, block: int = 128) -> dict[str, np.ndarray]:
    """A float [N, K] weight to E4M3 codes [N, K] and float32 scales per block x block tile."""
    n, k = w.shape
    rows, cols = -(-n // block), -(-k // block)
    scale = np.ones((rows, cols), np.float32)
    codes = np.empty((n, k), np.uint8)
    for i in range(rows):
        for j in range(cols):
            tile = w[i * block:(i + 1) * block, j * block:(j + 1) * block].astype(np.float32)
            scale[i, j] = max(float(np.abs(tile).max()) / 448.0, 1e-12)
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = to_e4m3(tile / scale[i, j])
    return {"weight": codes, "weight_scale_inv": scale}


def quantize_fp8(src: str | Path, out: str | Path) -> Path:
    return _quantize(src, out, lambda name, shape: name.startswith("model.layers.") and name.endswith("_proj.weight")
                     and len(shape) == 2, quantize_fp8_matrix,
                     {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})


def quantize_awq(src: str | Path, out: str | Path, group: int = 128) -> Path:
    if group not in (32, 128):
        raise ValueError(f"--group-size must be 32 or 128, got {group}")
    return _quantize(src, out, lambda name, shape: quantizable(name, shape, group), lambda w: quantize_matrix(w, group),
                     {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
                      "modules_to_not_convert": None})


def _quantize(src, out, chosen, quantize, quantization_config: dict) -> Path:
    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    if config.get("quantization_config"):
        raise ValueError(f"{src} is quantized already (quantization_config: {config['quantization_config']})")
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors weights in {src}")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():  # tokenizer, chat template, generation config ...
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    index = {}
    for shard in shards:
        tensors = read_safetensors(shard)
        produced: dict[str, np.ndarray] = {}
        fp8: set[str] = set()
        for name, arr in tensors.items():
            if chosen(name, arr.shape):
                base = name[: -len(".weight")]
                for part, value in quantize(arr).items():
                    produced[f"{base}.{part}"] = value
                    if part == "weight":  # FP8 codes in place of the weight
                        fp8.add(f"{base}.{part}")
            else:
                produced[name] = arr if arr.dtype != np.uint16 else arr.astype(np.float32)
        specs = [(name, tuple(a.shape), F8E4M3 if name in fp8 else a.dtype) for name, a in produced.items()]
        write_safetensors(out / shard.name, specs, produced.__getitem__)
        index.update({name: shard.name for name in produced})
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
