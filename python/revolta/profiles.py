"""Launch profiles: named sets of option values in configs/profiles/*.yaml.

Resolution order for each option: command line > environment (REVOLTA_<OPTION>) > profile >
default. resolve() returns validated Settings plus where each value came from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from revolta.config import OPTION_SECTIONS, describe_errors, EngineOptions, ServerOptions, Settings, build_settings

ENV_PREFIX = "REVOLTA_"


class ConfigError(ValueError):
    """An invalid option or combination; the message names the option(s)."""


def profile_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("REVOLTA_PROFILE_PATH"):
        dirs += [Path(p) for p in os.environ["REVOLTA_PROFILE_PATH"].split(os.pathsep)]
    dirs.append(Path(__file__).parent / "profiles")  # installed copies
    dirs.append(Path(__file__).resolve().parents[2] / "configs" / "profiles")  # source checkout
    return dirs


def available_profiles() -> list[str]:
    names = set()
    for d in profile_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def _named_profile(name: str) -> Path | None:
    """configs/profiles/NAME.yaml (or an installed copy), the first found."""
    return next((d / f"{name}.yaml" for d in profile_dirs() if (d / f"{name}.yaml").is_file()), None)


def load_profile_description(name: str) -> str:
    """A profile's one-line description ("" when it has none or cannot be read)."""
    p = _named_profile(name)
    try:
        data = yaml.safe_load(p.read_text()) if p else None
    except (OSError, yaml.YAMLError):
        return ""
    return str(data.get("description", "")) if isinstance(data, dict) else ""


def load_profile(name_or_path: str) -> dict[str, Any]:
    p = Path(name_or_path)
    if not p.is_file():
        p = _named_profile(name_or_path) or p
    if not p.is_file():
        raise ConfigError(f"profile '{name_or_path}' not found (available: {', '.join(available_profiles()) or 'none'})")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"profile {p}: expected a mapping of option names to values")
    data.pop("description", None)
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("engine", "server") and isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    try:
        build_settings(flat)  # a profile must be valid on its own
    except (ValidationError, ValueError) as e:
        if flat.get("device") != "cuda":
            raise ConfigError(f"profile {p}: {describe_errors(e)}") from e
        try:  # a CUDA profile read by a CPU build: the rest is checked here, the device once resolved
            build_settings({**flat, "device": "cpu"})
        except (ValidationError, ValueError) as e2:
            raise ConfigError(f"profile {p}: {describe_errors(e2)}") from e2
    return flat


def _env_values() -> dict[str, Any]:
    out = {}
    for name in OPTION_SECTIONS:
        raw = os.environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            out[name] = raw
    return out


def resolve(cli: dict[str, Any], profile: str | None = None) -> tuple[Settings, dict[str, dict[str, Any]]]:
    """Merges the sources; returns settings and {option: {"value": v, "source": s}}."""
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    layers = []
    if profile:
        layers.append(("profile:" + profile, load_profile(profile)))
    layers.append(("env", _env_values()))
    layers.append(("cli", {k: v for k, v in cli.items() if v is not None}))
    for src, values in layers:
        for k, v in values.items():
            merged[k] = v
            source[k] = src
    try:
        settings = build_settings(merged)
    except (ValidationError, ValueError) as e:
        raise ConfigError(f"invalid configuration: {describe_errors(e)}") from e
    report = {}
    for section, model in (("engine", settings.engine), ("server", settings.server)):
        for name in type(model).model_fields:
            value = getattr(model, name)
            if name == "api_key" and value:
                value = "***"
            report[name] = {"value": value, "source": source.get(name, "default")}
    return settings, report


def profile_line(profile: str, report: dict[str, dict[str, Any]]) -> str:
    """The startup log's provenance of a launch profile: what it set, and what the command line or
    environment set over it."""
    mine = load_profile(profile)
    kept = [f"{k}={report[k]['value']}" for k in mine if k in report and report[k]["source"].startswith("profile:")]
    over = [f"{k}={report[k]['value']} ({report[k]['source']})" for k in mine
            if k in report and not report[k]["source"].startswith("profile:")]
    return f"profile {profile}: {', '.join(kept) or 'nothing'}" + (f"; set over it: {', '.join(over)}" if over else "")


def report_line(report: dict[str, dict[str, Any]]) -> str:
    return json.dumps({"event": "resolved_config", "options": report}, default=str)


__all__ = ["ConfigError", "EngineOptions", "ServerOptions", "Settings", "resolve", "load_profile", "available_profiles", "profile_line", "report_line"]
