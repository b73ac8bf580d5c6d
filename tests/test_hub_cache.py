"""Models by Hub id from the Hugging Face cache, offline: `LLM("org/name")` and the server's
`--model org/name` read the snapshot that refs/main (or --revision: a branch, tag or commit) points
at, under --download-dir, HF_HUB_CACHE or HF_HOME/hub, laid out as huggingface_hub lays it out;
the engine's greedy tokens are transformers' for that snapshot. A model not cached, with
HF_HUB_OFFLINE set, is an error naming the repository and the cache searched."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conftest import hf_greedy, make_hf_model
from revolta import LLM, SamplingParams
from server_fixture import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from qwen4exp_reference import write_tokenizer  # noqa: E402

MAIN, TAGGED = "a" * 40, "b" * 40
PROMPT = [5, 17, 99, 3, 42]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A hub cache holding org/tiny at two commits: main (seed 1) and the tag v2 (seed 2)."""
    root = tmp_path_factory.mktemp("hub")
    repo = root / "models--org--tiny"
    models = {}
    for commit, seed in ((MAIN, 1), (TAGGED, 2)):
        models[commit] = make_hf_model("llama", repo / "snapshots" / commit, seed=seed, vocab_size=300)
        write_tokenizer(repo / "snapshots" / commit, 300)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v2").write_text(TAGGED)
    return root, models


def greedy(llm):
    return llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6))[0].outputs[0].token_ids


def test_hub_ids_resolve_from_the_cache(cache, monkeypatch):
    root, models = cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with LLM("org/tiny", download_dir=str(root), max_model_len=64) as llm:
        assert greedy(llm) == hf_greedy(models[MAIN], PROMPT, 6)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    for revision, commit in (("v2", TAGGED), (TAGGED, TAGGED), ("main", MAIN)):
        with LLM("org/tiny", revision=revision, max_model_len=64) as llm:
            assert greedy(llm) == hf_greedy(models[commit], PROMPT, 6), revision
    monkeypatch.delenv("HF_HUB_CACHE")
    home = root.parent / "hf_home"
    shutil.copytree(root, home / "hub", dirs_exist_ok=True)
    monkeypatch.setenv("HF_HOME", str(home))
    with LLM("org/tiny", max_model_len=64) as llm:
        assert greedy(llm) == hf_greedy(models[MAIN], PROMPT, 6)


def test_missing_models_name_the_repository_and_cache(cache, monkeypatch):
    root, _ = cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=rf"'org/absent' is not in the Hugging Face cache {root}"):
        LLM("org/absent", download_dir=str(root))
    with pytest.raises(FileNotFoundError, match="at revision 'v9'"):
        LLM("org/tiny", download_dir=str(root), revision="v9")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM("./not/here")


def test_server_serves_a_hub_id(cache):
    root, _ = cache
    srv = ServerProcess("--model", "org/tiny", "--download-dir", str(root), "--max-model-len", "64",
                        env={"HF_HUB_OFFLINE": "1"})
    try:
        import httpx

        names = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
        assert "org/tiny" in names
        r = httpx.post(srv.url + "/v1/completions", json={"model": "org/tiny", "prompt": PROMPT, "max_tokens": 3})
        assert r.status_code == 200, r.text
    finally:
        assert "Traceback" not in srv.stop()
