"""Models by Hub id (ORG/NAME) from the Hugging Face cache, as `huggingface-cli download` fills it:
ROOT/models--ORG--NAME/refs/REVISION holds a commit, ROOT/models--ORG--NAME/snapshots/COMMIT the
files. ROOT is --download-dir, else HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub.
A model not in the cache is downloaded through huggingface_hub (its progress bar), unless
HF_HUB_OFFLINE says there is no network; then the error names the repository and the cache."""

from __future__ import annotations

import os
import re
from pathlib import Path

# What the engine reads of a repository: configs, weights, tokenizer and templates (not the other
# formats a repository may also carry, such as .bin or .gguf copies).
WANTED = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "1_Pooling/*"]


def hub_cache(download_dir: str | None = None) -> Path:
    if download_dir:
        return Path(download_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def cached_snapshot(repo: str, revision: str | None, root: Path) -> Path | None:
    """The cached snapshot of repo at revision (a branch or tag through refs/, or a commit), if it
    holds a config.json."""
    base = root / ("models--" + repo.replace("/", "--"))
    rev = revision or "main"
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        commit = rev
    else:
        ref = base / "refs" / rev
        if not ref.is_file():
            return None
        commit = ref.read_text().strip()
    snap = base / "snapshots" / commit
    return snap if (snap / "config.json").is_file() else None


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_snapshot(repo: str, revision: str | None = None, download_dir: str | None = None) -> Path:
    """The local directory of repo (at revision): cached, or downloaded into the cache."""
    root = hub_cache(download_dir)
    found = cached_snapshot(repo, revision, root)
    if found is not None:
        return found
    at = f" at revision '{revision}'" if revision else ""
    if offline():
        raise FileNotFoundError(f"model '{repo}'{at} is not in the Hugging Face cache {root} and HF_HUB_OFFLINE forbids "
                                f"downloading it (download it with: huggingface-cli download {repo}"
                                f"{' --revision ' + revision if revision else ''}; or pass --download-dir)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(f"model '{repo}'{at} is not in the Hugging Face cache {root}, and downloading it needs "
                                "the huggingface_hub package (pip install huggingface_hub)") from None
    try:
        path = Path(snapshot_download(repo, revision=revision, cache_dir=str(root), allow_patterns=WANTED))
    except Exception as e:  # noqa: BLE001 - the hub's errors (network, 401, 404) become one message
        raise FileNotFoundError(f"model '{repo}'{at} is not in the Hugging Face cache {root} and could not be "
                                f"downloaded: {type(e).__name__}: {e}") from None
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model '{repo}'{at} has no config.json (downloaded to {path})")
    return path
