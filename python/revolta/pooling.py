"""Embeddings: how a model pools its final hidden states, as its sentence-transformers files say
(modules.json with a Pooling module's 1_Pooling/config.json, a Normalize module), else as vLLM
pools a decoder model: the last token's hidden state, normalised. The engine pools (SamplingParams
pooling "last" | "mean"); normalising and similarity are here."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from revolta import _core


@dataclass
class PoolingConfig:
    pooling: str = "last"  # last | mean
    normalize: bool = True


def pooling_config(model_dir: str | Path) -> PoolingConfig:
    """The model's pooling; ValueError for a pooling the engine does not do (CLS, max, weighted)."""
    d = Path(model_dir)
    modules_file = d / "modules.json" if d.is_dir() else None
    if modules_file is None or not modules_file.is_file():
        return PoolingConfig()
    modules = json.loads(modules_file.read_text())
    types = {m.get("type", "").rsplit(".", 1)[-1]: m for m in modules}
    cfg = PoolingConfig(pooling="last", normalize="Normalize" in types)
    if "Pooling" in types:
        path = d / types["Pooling"].get("path", "1_Pooling") / "config.json"
        modes = json.loads(path.read_text()) if path.is_file() else {}
        on = [k[len("pooling_mode_"):] for k, v in modes.items() if k.startswith("pooling_mode_") and v is True]
        if on == ["mean_tokens"]:
            cfg.pooling = "mean"
        elif on == ["lasttoken"]:
            cfg.pooling = "last"
        else:
            raise ValueError(f"{path}: pooling {', '.join(on) or 'none'} is not supported (last token or mean only)")
    return cfg


def pooling_params(cfg: PoolingConfig) -> _core.SamplingParams:
    p = _core.SamplingParams()
    p.max_tokens = 1
    p.pooling = cfg.pooling
    return p


def finish(vector: list[float], normalize: bool) -> list[float]:
    """The engine's pooled vector, L2-normalised when the model's pooling says so."""
    if not normalize:
        return list(vector)
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def cosine(a: list[float], b: list[float]) -> float:
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b)) / ((na * nb) or 1.0)
