"""Default sampling parameters from the model, as vLLM's --generation-config does: with "auto" the
sampling fields of the model's generation_config.json (temperature, top_p, top_k, min_p,
repetition_penalty, max_new_tokens as max_tokens) become the defaults of every request that leaves
them out; "vllm" ignores the file; a directory reads its generation_config.json instead.
override_generation_config (a profile's or the command line's) goes on top. A request's own
values always win."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# generation_config.json key -> SamplingParams field
FROM_FILE = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
             "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
OVERRIDABLE = set(FROM_FILE.values()) | {"presence_penalty", "frequency_penalty"}

# The embedded demo model's card recommends these (SmolLM2-135M-Instruct); its GGUF carries none.
DEMO_DEFAULTS = {"temperature": 0.2, "top_p": 0.9}


def generation_defaults(model_dir: str | None, mode: str = "auto",
                        overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The default sampling fields; ValueError naming generation_config or override_generation_config."""
    found: dict[str, Any] = {}
    if mode != "vllm":
        folder = Path(model_dir) if mode == "auto" and model_dir else Path(mode) if mode != "auto" else None
        if mode not in ("auto", "vllm") and not (folder / "generation_config.json").is_file():
            raise ValueError(f"generation_config: no generation_config.json in {mode}")
        path = folder / "generation_config.json" if folder else None
        if path and path.is_file():
            try:
                data = json.loads(path.read_text())
            except ValueError as e:
                raise ValueError(f"generation_config: {path} is not valid JSON ({e})") from None
            found = {field: data[key] for key, field in FROM_FILE.items() if data.get(key) is not None}
    extra = dict(overrides or {})
    unknown = sorted(set(extra) - OVERRIDABLE)
    if unknown:
        raise ValueError(f"override_generation_config: unknown field(s) {', '.join(unknown)} "
                         f"(allowed: {', '.join(sorted(OVERRIDABLE))})")
    return {**found, **extra}


def describe(defaults: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in defaults.items()) or "none (temperature 1.0, top_p 1.0)"
