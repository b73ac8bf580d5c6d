"""Bad input gets a clear Python exception, and the engine keeps working afterwards."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from conftest import make_hf_model
from revolta import LLM, SamplingParams


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", path, max_position_embeddings=64)
    return path


@pytest.fixture(scope="module")
def llm(model_dir):
    with LLM(str(model_dir), kv_cache_memory_bytes=4 << 20) as engine:
        yield engine


def still_works(llm: LLM) -> None:
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


def test_missing_model_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "nowhere"))


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LLM(str(tmp_path))


def test_corrupt_safetensors_header(model_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    st = bad / "model.safetensors"
    data = bytearray(st.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    data[8 : 8 + n] = b"{" + b"x" * (n - 1)  # header no longer JSON
    st.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="corrupt safetensors file .*model.safetensors"):
        LLM(str(bad))
    data[:8] = struct.pack("<Q", len(data) * 2)  # header length past the end of the file
    st.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="header length"):
        LLM(str(bad))


def test_missing_tensor_is_named(model_dir, tmp_path):
    bad = tmp_path / "missing"
    shutil.copytree(model_dir, bad)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(bad / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(RuntimeError, match="missing tensor 'model.layers.1.mlp.down_proj.weight'"):
        LLM(str(bad))


def test_unsupported_architecture_is_named(model_dir, tmp_path):
    bad = tmp_path / "arch"
    shutil.copytree(model_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture 'GPTNeoXForCausalLM'"):
        LLM(str(bad))


def test_bad_engine_options_name_the_option(model_dir):
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(str(model_dir), max_model_len=10_000)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        LLM(str(model_dir), kv_cache_memory_bytes=1024)
    with pytest.raises(ValueError, match="block_size"):
        LLM(str(model_dir), block_size=12)
    with pytest.raises(ValueError, match="dtype"):
        LLM(str(model_dir), dtype="int3")


def test_prompt_longer_than_max_model_len(llm):
    with pytest.raises(ValueError, match="at most 63 prompt tokens"):
        llm.generate([[5] * 65], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match=r"max_model_len \(64\) leaves room"):  # no room for one output token
        llm.generate([[5] * 64], SamplingParams(max_tokens=1))
    out = llm.generate([[5] * 63], SamplingParams(max_tokens=8, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 1 and out[0].outputs[0].finish_reason == "length"
    still_works(llm)


def test_token_outside_vocabulary(llm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 10_000]], SamplingParams(max_tokens=1))
    still_works(llm)


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.5),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -3),
        ("top_k", 10**12),  # past the engine's int32
        ("max_tokens", 2**31),
        ("min_tokens", 2**40),
        ("stop_token_ids", [2**40]),
        ("min_p", 2.0),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("max_tokens", 0),
        ("logprobs", 50),
        ("n", 0),
        ("seed", -1),
    ],
)
def test_invalid_sampling_values(llm, field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
    still_works(llm)


def test_core_rejects_invalid_params_too(llm):
    # The C++ engine validates on its own (embedders do not go through the Python dataclass).
    from revolta import _core

    p = _core.SamplingParams()
    p.top_p = 2.0
    with pytest.raises(ValueError, match="top_p"):
        llm.engine.add_request([1, 2, 3], p)
    still_works(llm)


def test_empty_prompt(llm):
    with pytest.raises(ValueError, match="at least one token"):
        llm.generate([{"prompt_token_ids": []}], SamplingParams(max_tokens=1))
    still_works(llm)
