"""compressed-tensors int4 checkpoints (llm-compressor's `pack-quantized` W4A16) read as the AWQ
layout the engine's int4 kernels take, once, into the cache.

A pack-quantized linear holds `weight_packed` (int32 [N, K / 8]: value k of a row at bits 4 (k % 8)
of word k / 8, stored as the signed value + 8), `weight_scale` ([N, K / group], or [N, 1] per
channel), `weight_shape` and, when asymmetric, `weight_zero_point` (packed the same way down the
output dimension). Its weight is (q - z) * scale per group of input columns, which is AWQ's
formula with q + 8 and z + 8 as the unsigned codes; a per-channel scale is written out per group
of 128 (or 32) columns. Linears the checkpoint leaves in 16 bits (its `ignore` list) stay as they
are. Activation-order (`actorder`) and 8-bit weights are refused, naming them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from revolta.models.safetensors_io import read_safetensors, write_safetensors
from revolta.quantize import pack_columns


def wants_import(config: dict) -> bool:
    q = config.get("quantization_config") or {}
    if str(q.get("quant_method", "")).lower() != "compressed-tensors":
        return False
    return any((g.get("weights") or {}).get("type") == "int" for g in (q.get("config_groups") or {}).values())


def check_scheme(config: dict, src: Path) -> None:
    """ValueError naming what this import does not take."""
    q = config["quantization_config"]
    fmt = q.get("format")
    if fmt not in ("pack-quantized", None):
        raise ValueError(f"{src}: compressed-tensors format '{fmt}' is not supported (pack-quantized int4)")
    for name, g in (q.get("config_groups") or {}).items():
        w = g.get("weights") or {}
        what = f"{src}: compressed-tensors group '{name}'"
        if w.get("type") != "int" or w.get("num_bits") != 4:
            raise ValueError(f"{what} has {w.get('num_bits')}-bit {w.get('type')} weights; int4 is supported")
        if w.get("strategy") not in ("group", "channel"):
            raise ValueError(f"{what} has strategy '{w.get('strategy')}'; group and channel are supported")
        if w.get("actorder") not in (None, False):
            raise ValueError(f"{what} uses activation order (actorder '{w.get('actorder')}'), which is not supported yet")
        if g.get("input_activations"):
            raise ValueError(f"{what} quantizes activations too; weight-only int4 (W4A16) is supported")


def unpack_rows(packed: np.ndarray, cols: int) -> np.ndarray:
    """int32 [R, W] with 8 four-bit codes per word (code j at bits 4j) to uint8 [R, cols]."""
    b = np.ascontiguousarray(packed).view(np.uint8).reshape(packed.shape[0], -1)  # little-endian bytes
    out = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = b & 0xF, b >> 4
    return out[:, :cols]


def awq_group(k: int) -> int:
    for g in (128, 32):
        if k % g == 0:
            return g
    raise ValueError(f"a per-channel int4 linear with {k} input columns: AWQ's layout needs a multiple of 32")


def to_awq(t: dict[str, np.ndarray], base: str) -> tuple[dict[str, np.ndarray], int]:
    """One pack-quantized linear as AWQ's qweight / qzeros / scales, and its group size."""
    n, k = (int(x) for x in t[base + ".weight_shape"])
    if n % 8:
        raise ValueError(f"{base}: {n} output rows; AWQ's layout needs a multiple of 8")
    q = unpack_rows(t[base + ".weight_packed"], k)  # [N, K], codes = signed + 8
    scale = np.asarray(t[base + ".weight_scale"], dtype=np.float32).reshape(n, -1)
    groups = scale.shape[1]
    if base + ".weight_zero_point" in t:
        z = unpack_rows(np.ascontiguousarray(t[base + ".weight_zero_point"].T), n).T  # [N, groups]
    else:
        z = np.full((n, groups), 8, dtype=np.uint8)
    group = k // groups
    if groups == 1 or group not in (32, 128):  # per channel (or a group AWQ's kernels lack): finer groups, same values
        if k % groups:
            raise ValueError(f"{base}: {groups} scale groups do not divide its {k} input columns")
        target = awq_group(group)
        if group % target:
            raise ValueError(f"{base}: group size {group} cannot be written as AWQ groups of 32 or 128")
        scale, z, group = np.repeat(scale, group // target, axis=1), np.repeat(z, group // target, axis=1), target
    parts = {"qweight": pack_columns(q.T), "qzeros": pack_columns(z.T),
             "scales": np.ascontiguousarray(scale.T.astype(np.float16))}
    return parts, group


def import_compressed(src: Path, cache: Path) -> str:
    """The AWQ form of a compressed-tensors int4 checkpoint, made once under `cache`."""
    config = json.loads((src / "config.json").read_text())
    check_scheme(config, src)
    shards = sorted(src.glob("*.safetensors"))
    if not any(name.endswith(".weight_packed") for s in shards for name in read_safetensors(s)):
        groups = ", ".join(f"'{n}' ({g['weights'].get('num_bits')}-bit {g['weights'].get('type')})"
                           for n, g in config["quantization_config"]["config_groups"].items())
        raise ValueError(f"{src}: quantization_config declares compressed-tensors weights in group {groups}, but no "
                         "tensor is pack-quantized (no .weight_packed): the checkpoint and its config disagree")
    stamp = "".join(f"{s.name}:{s.stat().st_size}:{s.stat().st_mtime_ns};" for s in shards)
    out = cache / f"{src.name}-awq-{hashlib.sha256((str(src.resolve()) + stamp).encode()).hexdigest()[:16]}"
    if (out / "config.json").is_file():
        return str(out)
    part = out.with_name(out.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    for f in src.iterdir():  # tokenizer, templates, generation config ...
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, part / f.name)
    index, groups = {}, set()
    for shard in shards:
        tensors = read_safetensors(shard)
        produced: dict[str, np.ndarray] = {}
        for name, arr in tensors.items():
            if name.endswith(".weight_packed"):
                base = name[: -len(".weight_packed")]
                parts, group = to_awq(tensors, base)
                groups.add(group)
                produced.update({f"{base}.{p}": v for p, v in parts.items()})
            elif not name.endswith((".weight_scale", ".weight_zero_point", ".weight_shape", ".weight_g_idx")):
                produced[name] = arr if arr.dtype != np.uint16 else arr.astype(np.float32)
        write_safetensors(part / shard.name, [(n, tuple(a.shape), a.dtype) for n, a in produced.items()],
                          produced.__getitem__)
        index.update({n: shard.name for n in produced})
    if len(groups) > 1:
        raise ValueError(f"{src}: int4 groups of {sorted(groups)} columns in one checkpoint; one group size is supported")
    if len(shards) > 1:
        (part / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": groups.pop() if groups else 128,
                                     "zero_point": True, "version": "gemm", "modules_to_not_convert": None,
                                     "imported_from": "compressed-tensors pack-quantized"}
    (part / "config.json").write_text(json.dumps(config, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    part.rename(out)
    return str(out)
