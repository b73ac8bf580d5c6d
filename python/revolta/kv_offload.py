"""KV offload options (the engine's host-memory and disk tiers, cache/kv_tiers.h) onto an EngineConfig:
vLLM's `kv_offloading_size` (GiB of host memory) and an LMCache-style disk tier given as
{"root_dir": ..., "max_size_bytes": ..., "min_free_bytes": ...}."""

from __future__ import annotations

from typing import Any

from revolta.json_options import json_object

DISK_KEYS = {"root_dir": "kv_offloading_disk_dir", "max_size_bytes": "kv_offloading_disk_max_bytes",
             "min_free_bytes": "kv_offloading_disk_min_free_bytes"}


def parse_disk(disk: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """The disk tier's options as a dict (JSON text accepted); unknown keys are refused by name."""
    disk = json_object(disk, "kv_offloading_disk", DISK_KEYS)
    if disk is not None and not disk.get("root_dir"):
        raise ValueError("kv_offloading_disk: root_dir is required")
    return disk


def apply_kv_offloading(cfg, size: float, eviction: str, disk: dict[str, Any] | str | None) -> None:
    cfg.kv_offloading_size = float(size)
    cfg.kv_offloading_eviction = eviction
    for key, value in (parse_disk(disk) or {}).items():
        setattr(cfg, DISK_KEYS[key], str(value) if key == "root_dir" else int(value))
