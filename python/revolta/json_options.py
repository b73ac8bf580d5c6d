"""Options whose value is a JSON object (kv_offloading_disk, watchdog_config): given as a dict or
as JSON text (a flag or an environment variable), with unknown keys refused by name."""

from __future__ import annotations

import json
from typing import Any, Iterable


def json_object(value: Any, option: str, known: Iterable[str]) -> dict[str, Any] | None:
    """The option's dict; None for None or ""; ValueError naming the option otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{option} is not valid JSON: {e}") from None
    known = list(known)
    if not isinstance(value, dict):
        raise ValueError(f"{option} must be a JSON object with the keys {', '.join(known)}")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{option}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return value
