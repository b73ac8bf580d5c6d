"""Flash-Next from a GGUF file that llama.cpp's own converter wrote (tests/fixtures/qwen4exp/
hc2-qsa4-ple.gguf, made by tools/qwen4exp_reference.py from the checkpoint `make_checkpoint`
builds): the import maps every tensor back onto the checkpoint's names and values, the engine then
matches transformers on that checkpoint, and llama.cpp's figures for the same file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from revolta import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import qwen4exp_reference as ref  # noqa: E402
from test_flash_next import FIXTURES, PROMPTS, assert_matches_llama_cpp, hf_greedy  # noqa: E402

CASE = "hc2-qsa4-ple"  # two streams, QSA ratio 4, PLE, 2 DeltaNet key heads for 4 value heads
GGUF = FIXTURES / f"{CASE}.gguf"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    return ref.make_checkpoint(CASE, path), path


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    from revolta.models.gguf_import import import_gguf

    return import_gguf(GGUF, tmp_path_factory.mktemp("gguf") / "model", progress=False)


def test_import_restores_every_checkpoint_tensor(checkpoint, imported):
    """Norms stored as 1 + w, ssm_a as -exp(A_log), V heads tiled, the indexer projection split,
    experts stacked, the PLE table joined and its constants in keys: all undone."""
    from revolta.models.safetensors_io import read_safetensors

    _, path = checkpoint
    want = read_safetensors(path / "model.safetensors")
    got = read_safetensors(imported / "model.safetensors")
    base = "model.layers.0.ple.ple_embedding.ngram_embedding."
    shards = sorted((n for n in want if n.startswith(base + "shard_")), key=lambda n: int(n.split("_")[-1].split(".")[0]))
    want = {n: v for n, v in want.items() if n not in shards}
    want[base + "weight"] = np.concatenate([np.asarray(read_safetensors(path / "model.safetensors")[n]) for n in shards])
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = np.asarray(got[name])
        assert g.shape == np.asarray(w).shape, name
        if g.dtype == np.int64:
            assert np.array_equal(g, w), name
        else:
            assert np.abs(g - np.asarray(w, dtype=np.float32)).max() <= 1e-6, name
    cfg = json.loads((imported / "config.json").read_text())
    assert cfg["layer_types"] == ["linear_attention", "indexed_attention"] * 2
    assert (cfg["indexer_compress_ratio"], cfg["indexer_budget"], cfg["hc_count"], cfg["ple_layer_ids"]) == (4, 8, 2, [1])


def test_prompt_logits_and_greedy_match_transformers(checkpoint):
    """Loaded by path as a user passes it (resolved into the cache), every prompt position within
    1e-4 of transformers on the checkpoint the file was converted from, and equal greedy tokens."""
    model, _ = checkpoint
    with ref.ties_to_lower_block(), torch.no_grad():
        logits = model(torch.tensor([ref.PROMPT])).logits[0]
        expected = [hf_greedy(model, p, 16) for p in PROMPTS]
    prefixes = [ref.PROMPT[:n] for n in range(1, len(ref.PROMPT) + 1)]
    greedy = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, return_generation_logits=True)
    with LLM(str(GGUF), kv_cache_memory_bytes=16 << 20, max_num_seqs=len(prefixes)) as llm:
        assert llm.model_info.architecture == "Qwen4ExpForCausalLM"
        outs = llm.generate(prefixes, greedy)
        for n, out in enumerate(outs):
            err = (torch.tensor(out.outputs[0].generation_logits[0]) - logits[n]).abs().max().item()
            assert err < 1e-4, f"position {n}: max |logit diff| {err}"
        tokens = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
        assert [list(o.outputs[0].token_ids) for o in tokens] == expected


def test_matches_llama_cpp_on_its_own_file(imported, tmp_path):
    """With QSA (compress ratio 4) up to where llama.cpp's cell rule parts from transformers'
    (position 11, see test_flash_next); with the layers dense (ratio 0, as llama.cpp ran the file
    converted from the indexed_attention spelling) at every position and 32 greedy tokens."""
    assert_matches_llama_cpp(str(imported), CASE, "llama_cpp_", 11)
    dense = tmp_path / "dense"
    dense.mkdir()
    for f in imported.iterdir():
        (dense / f.name).symlink_to(f)
    cfg = json.loads((imported / "config.json").read_text())
    del cfg["indexer_n_heads"]
    (dense / "config.json").unlink()
    (dense / "config.json").write_text(json.dumps(cfg))
    assert_matches_llama_cpp(str(dense), CASE, "llama_cpp_dense_", 40)


def rewrite(dst: Path, tensor=None, extra: dict | None = None) -> Path:
    """The fixture file rewritten by gguf-py: every key kept, each tensor as `tensor(name, data,
    ggml shape)` returns it ((array, raw type) or None to keep it), plus `extra` float32 tensors."""
    import gguf
    from gguf import GGUFReader

    reader = GGUFReader(str(GGUF))
    writer = gguf.GGUFWriter(str(dst), arch="qwen4exp")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    for t in reader.tensors:
        shape = list(reversed(t.shape.tolist()))
        changed = tensor(t.name, np.asarray(t.data), shape) if tensor else None
        data, raw = changed or (np.asarray(t.data), t.tensor_type)
        # (gguf-py takes a block type's shape in bytes)
        writer.add_tensor(t.name, data, raw_shape=list(data.shape) if changed else shape, raw_dtype=raw)
    for name, data in (extra or {}).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_a_file_it_cannot_map_is_refused_naming_the_tensor(tmp_path):
    """A tensor the converter never writes is an error naming it, not a model missing a part."""
    from revolta.models.gguf_import import import_gguf
    from revolta.models.gguf_qwen4exp import Qwen4ExpGGUFError

    bad = rewrite(tmp_path / "bad.gguf", extra={"blk.0.ssm_mystery.weight": np.zeros((4, 4), dtype=np.float32)})
    with pytest.raises(Qwen4ExpGGUFError, match="blk.0.ssm_mystery.weight"):
        import_gguf(bad, tmp_path / "out", progress=False)


def test_a_q8_0_file_imports_its_dequantized_matrices(checkpoint, tmp_path):
    """The file with its matrices in Q8_0 blocks (as `llama-quantize` leaves the small 1-D tensors
    in float32): the import holds gguf-py's dequantisation of each block, mapped like the float32
    file's, and the model stays close to the float32 one."""
    import gguf
    from gguf.quants import dequantize, quantize

    from revolta.models.gguf_import import import_gguf
    from revolta.models.safetensors_io import read_safetensors

    q8 = gguf.GGMLQuantizationType.Q8_0
    quantized = []

    def to_q8(name, data, shape):
        if len(shape) < 2 or shape[-1] % 32 or name.startswith("per_layer_token_embd"):
            return None
        quantized.append(name)
        return quantize(data.reshape(-1, shape[-1]).astype(np.float32), q8).reshape(*shape[:-1], -1), q8

    path = rewrite(tmp_path / "q8.gguf", to_q8)
    assert len(quantized) > 40
    out = import_gguf(path, tmp_path / "q8", progress=False)
    got = read_safetensors(out / "model.safetensors")
    # one matrix mapped without any change, one whose V heads are regrouped
    for gguf_name, hf in (("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight"),
                          ("blk.0.ssm_out.weight", "model.layers.0.linear_attn.out_proj.weight")):
        from gguf import GGUFReader

        t = next(t for t in GGUFReader(str(path)).tensors if t.name == gguf_name)
        blocks = dequantize(t.data, t.tensor_type).reshape(np.asarray(got[hf]).shape)
        if "ssm_out" in gguf_name:  # tiled (v, k) -> grouped (k, v) along the input columns
            blocks = blocks.reshape(blocks.shape[0], 2, 2, -1).swapaxes(1, 2).reshape(blocks.shape)
        assert np.array_equal(np.asarray(got[hf]), blocks), hf
    model, _ = checkpoint
    with ref.ties_to_lower_block(), torch.no_grad():
        want = model(torch.tensor([ref.PROMPT])).logits[0, -1]
    greedy = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, return_generation_logits=True)
    with LLM(str(out), kv_cache_memory_bytes=16 << 20) as llm:
        logits = torch.tensor(llm.generate([ref.PROMPT], greedy)[0].outputs[0].generation_logits[0])
    err = (logits - want).abs().max().item()
    assert 1e-5 < err < 0.1 * want.abs().max().item(), err
