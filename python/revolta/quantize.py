"""`revolta quantize --awq`: a model directory's linear layers to 4-bit AWQ checkpoints.

Round-to-nearest with a scale and a zero point per group of 32 or 128 input columns (min / max of
the group), packed in the AutoAWQ GEMM layout (`qweight` / `qzeros` int32, 8 output columns per
word in AWQ's order, `scales` float16) and declared by a `quantization_config` in config.json, so
that any reader of AWQ checkpoints takes it. It does not search activation-aware scales (AutoAWQ
does): the point is a real checkpoint of the format, for tests and for trying the 4-bit path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from revolta.models.safetensors_io import read_safetensors, write_safetensors

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


def quantize_awq(src: str | Path, out: str | Path, group: int = 128) -> Path:
    src, out = Path(src), Path(out)
    if group not in (32, 128):
        raise ValueError(f"--group-size must be 32 or 128, got {group}")
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
        for name, arr in tensors.items():
            if quantizable(name, arr.shape, group):
                base = name[: -len(".weight")]
                for part, value in quantize_matrix(arr, group).items():
                    produced[f"{base}.{part}"] = value
            else:
                produced[name] = arr if arr.dtype != np.uint16 else arr.astype(np.float32)
        specs = [(name, tuple(a.shape), a.dtype) for name, a in produced.items()]
        write_safetensors(out / shard.name, specs, produced.__getitem__)
        index.update({name: shard.name for name in produced})
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                     "version": "gemm", "modules_to_not_convert": None}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
