"""speculative_config, as vLLM spells it, onto the engine's config."""

from __future__ import annotations

from typing import Any

from revolta import _core

_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "draft_sample_method"}


def apply_speculative_config(cfg: _core.EngineConfig, spec: dict[str, Any] | None) -> None:
    """Sets the engine's speculative options; raises ValueError naming speculative_config's field."""
    if not spec:
        return
    if not isinstance(spec, dict):
        raise ValueError(f"speculative_config must be a JSON object, got {spec!r}")
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise ValueError(f"speculative_config: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
    method = spec.get("method")
    if method is None:
        raise ValueError("speculative_config: 'method' is required ('ngram' or 'mtp')")
    for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"):
        value = spec.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2**31 - 1):
            raise ValueError(f"speculative_config: {name} must be an integer, got {value!r}")
    cfg.speculative_method = str(method)
    cfg.draft_sample_method = str(spec.get("draft_sample_method", "greedy"))
    # vLLM's default for mtp: one draft per MTP layer (the checkpoints carry one).
    cfg.num_speculative_tokens = int(spec.get("num_speculative_tokens", 1 if method == "mtp" else 0))
    lookup_max = int(spec.get("prompt_lookup_max", 4))
    cfg.prompt_lookup_max = lookup_max
    cfg.prompt_lookup_min = int(spec.get("prompt_lookup_min", min(1, lookup_max)))
