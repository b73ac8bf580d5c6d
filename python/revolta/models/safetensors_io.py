"""A minimal streaming safetensors writer (numpy arrays in, one file out)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}


class F8E4M3:
    """Marks a uint8 array's bytes as FP8 E4M3 codes in a spec (numpy has no such type)."""

    itemsize = 1


def write_safetensors(
    path: str | Path,
    specs: Iterable[tuple[str, tuple[int, ...], np.dtype]],
    produce: Callable[[str], np.ndarray],
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes tensors one at a time, so only one is in memory.

    specs: (name, shape, dtype) of every tensor in file order; produce(name) returns its array.
    """
    specs = list(specs)
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, shape, dtype in specs:
        fp8 = dtype is F8E4M3
        nbytes = int(np.prod(shape, dtype=np.int64)) * (1 if fp8 else np.dtype(dtype).itemsize)
        header[name] = {"dtype": "F8_E4M3" if fp8 else _DTYPES[np.dtype(dtype)], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep the data section 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, dtype in specs:
            arr = np.ascontiguousarray(produce(name), dtype=np.uint8 if dtype is F8E4M3 else dtype)
            if tuple(arr.shape) != tuple(shape):
                raise ValueError(f"{name}: produced shape {arr.shape}, declared {shape}")
            f.write(arr.tobytes())


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a read-only numpy view of a memory map (BF16 as
    float32 copies: numpy has no bfloat16; F8_E4M3 as its uint8 codes)."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    (size,) = struct.unpack("<Q", bytes(raw[:8]))
    header = json.loads(bytes(raw[8:8 + size]))
    types = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BF16": np.uint16,
             "F8_E4M3": np.uint8}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in types:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, which this reader does not take")
        begin, end = info["data_offsets"]
        arr = raw[8 + size + begin:8 + size + end].view(types[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    return out
