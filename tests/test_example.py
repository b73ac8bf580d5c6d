"""The C++ example program links librevolta, loads a model directory and generates from token
ids; its output must equal the Python engine's and HF transformers' greedy tokens."""

from __future__ import annotations

import subprocess
from pathlib import Path

import revolta
from conftest import hf_greedy, make_hf_model
from revolta import LLM, SamplingParams


def test_example_generates_like_hf(tmp_path):
    model = make_hf_model("qwen3", tmp_path / "m", seed=3)
    exe = Path(revolta.__file__).parent / "bin" / "revolta_generate"
    assert exe.is_file(), "the example program is built and installed with the package"
    prompt = [11, 42, 7, 99, 3, 250, 18]
    proc = subprocess.run(
        [str(exe), str(tmp_path / "m"), "--max-tokens", "12", *map(str, prompt)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    tokens = [int(t) for t in lines[0].split()]
    assert lines[1] in ("length", "stop")
    expected = hf_greedy(model, prompt, 12)
    if lines[1] == "stop":  # EOS ended it early: the tokens so far still match
        expected = expected[: len(tokens)]
    assert tokens == expected
    with LLM(str(tmp_path / "m"), kv_cache_memory_bytes=4 << 20) as llm:
        ours = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12))[0].outputs[0].token_ids
    assert ours == tokens


def test_example_reports_errors(tmp_path):
    exe = Path(revolta.__file__).parent / "bin" / "revolta_generate"
    proc = subprocess.run([str(exe), str(tmp_path / "nope"), "1", "2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "is not a directory" in proc.stderr
