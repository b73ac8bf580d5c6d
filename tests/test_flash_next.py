"""Flash-Next (`qwen4_exp`) against references nobody here wrote.

transformers 5.25's Qwen4ExpForCausalLM on tiny random models (tools/qwen4exp_reference.py makes
them from a seed): prompt logits at every position, greedy tokens, and the same tokens under
concurrency, chunked prefill, prefix-cache hits and preemption. QSA's block choice ties whenever
relu zeroes several blocks' scores; the engine keeps the higher score first and, on a tie, the
lower block, and transformers' own forward is run with that rule for the comparison (its topk
leaves tie order unspecified). llama.cpp's figures for the same models are fixture files
(tests/fixtures/qwen4exp): with dense attention (compress ratio 0) the engine agrees with them at
every position, with QSA up to where llama.cpp's cell rule and transformers' part."""

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

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "qwen4exp"
CASES = {
    "hc2-qsa4-ple": {},  # QSA ratio 4 keeping 2 blocks; PLE on layer 1; ties in the block choice
    "hc4-qsa8": {},  # four streams, QSA ratio 8 keeping 1 block, no PLE
    "hc2-allcells-ple-nk4": {},  # a budget past the context (every cell), 4 key heads for 4 value heads
}
PROMPTS = [ref.PROMPT, [(11 * i + 5) % 500 + 3 for i in range(70)], [9, 8, 7, 6, 5], [ref.EOS] * 3 + list(range(40, 57))]
GEN = 24


@torch.no_grad()
def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(torch.argmax(model(torch.tensor([seq]), use_cache=False).logits[0, -1])))
    return seq[len(ids):]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = ref.make_checkpoint(request.param, path)
    ties: list = []
    with ref.ties_to_lower_block(ties), torch.no_grad():
        logits = model(torch.tensor([ref.PROMPT])).logits[0].float()
        expected = [hf_greedy(model, p, GEN) for p in PROMPTS]
    return request.param, model, str(path), logits, expected, ties


def greedy(n: int = GEN, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def run(llm: LLM, prompts) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy())]


def test_prompt_logits_match_transformers_at_every_position(case):
    name, _, path, logits, _, _ = case
    prefixes = [ref.PROMPT[:n] for n in range(1, len(ref.PROMPT) + 1)]
    with LLM(path, kv_cache_memory_bytes=16 << 20, max_num_seqs=len(prefixes)) as llm:
        outs = llm.generate(prefixes, greedy(1, return_generation_logits=True))
    for n, out in enumerate(outs):
        err = (torch.tensor(out.outputs[0].generation_logits[0]) - logits[n]).abs().max().item()
        assert err < 1e-4, f"{name}: position {n}: max |logit diff| {err}"


def test_greedy_matches_transformers_concurrently_and_from_the_prefix_cache(case):
    _, _, path, _, expected, _ = case
    with LLM(path, kv_cache_memory_bytes=16 << 20, enable_prefix_caching=True) as llm:
        assert run(llm, PROMPTS) == expected
        hits = llm.stats().prefix_cache_hits
        assert run(llm, PROMPTS) == expected  # full blocks, indexer keys and PLE state from the cache
        assert llm.stats().prefix_cache_hits > hits


@pytest.mark.parametrize("budget", [5, 16])
def test_greedy_under_chunked_prefill(case, budget):
    _, _, path, _, expected, _ = case
    with LLM(path, kv_cache_memory_bytes=16 << 20, max_num_batched_tokens=budget) as llm:
        assert run(llm, PROMPTS) == expected


def test_greedy_under_preemption(case):
    _, model, path, _, expected, _ = case
    c = model.config
    attention = sum(t != "linear_attention" for t in c.layer_types)
    per_token = attention * (2 * c.num_key_value_heads * c.head_dim + c.indexer_head_dim) * 4  # K, V, indexer key
    max_len = max(map(len, PROMPTS)) + GEN + 1
    block, seqs = 16, 4
    blocks = -(-max_len // block) + 1  # one longest request, not all four
    with LLM(path, max_model_len=max_len, block_size=block, max_num_seqs=seqs, enable_prefix_caching=False,
             kv_cache_memory_bytes=blocks * block * per_token + seqs * state_bytes_per_slot(c)) as llm:
        assert run(llm, PROMPTS) == expected
        assert llm.stats().num_preemptions > 0


def state_bytes_per_slot(c) -> int:
    """DeltaNet conv and delta-rule states, and each PLE layer's n-gram window and conv history."""
    linear = sum(t == "linear_attention" for t in c.layer_types)
    conv_dim = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    gdn = conv_dim * (c.linear_conv_kernel_dim - 1) + c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
    ple = (c.ngram_size - 1) + c.hc_count * c.hidden_size * (c.ple_conv_kernel_size - 1) * c.ngram_size
    return 4 * (linear * gdn + len(c.ple_layer_ids) * ple)


def test_qsa_ties_follow_the_stated_rule():
    """The ratio-4 case's block choice ties (relu leaves several blocks at 0) at least once, and the
    engine matches transformers run with the stated rule there (the logits test above), not merely
    where no tie decides."""
    model = ref.make_model("hc2-qsa4-ple")
    ties: list = []
    with ref.ties_to_lower_block(ties), torch.no_grad():
        model(torch.tensor([ref.PROMPT]))
    assert ties, "the tie case has no tie: pick another seed"


def fixture(name: str):
    return np.load(FIXTURES / f"{name}.npz")


def assert_matches_llama_cpp(path: str, name: str, prefix: str, positions: int) -> None:
    """The first `positions` prompt positions' logits within 1e-3 of llama.cpp's; with all 40, the
    32 greedy tokens too."""
    f = fixture(name)
    prompt = [int(t) for t in f["prompt"]]
    with LLM(path, kv_cache_memory_bytes=16 << 20, max_num_seqs=positions) as llm:
        outs = llm.generate([prompt[:k] for k in range(1, positions + 1)], greedy(1, return_generation_logits=True))
        for k, out in enumerate(outs):
            err = float(np.abs(np.array(out.outputs[0].generation_logits[0]) - f[prefix + "logits"][k]).max())
            assert err < 1e-3, f"{name}: position {k}: max |logit diff| to llama.cpp {err}"
        if positions == len(prompt):
            tokens = llm.generate([prompt], greedy(len(f[prefix + "greedy"])))[0].outputs[0].token_ids
            assert list(tokens) == [int(t) for t in f[prefix + "greedy"]]


@pytest.mark.parametrize("name", list(CASES))
def test_dense_attention_matches_llama_cpp_everywhere(tmp_path, name):
    """QSA ratio 0: the checkpoint without indexer fields runs dense attention, as llama.cpp does for
    a layer whose compress ratio is 0; every position and 32 greedy tokens agree (two and four
    streams, PLE on and off, 2 and 4 DeltaNet key heads for 4 value heads)."""
    ref.make_checkpoint(name, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["indexer_n_heads"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert_matches_llama_cpp(str(tmp_path), name, "llama_cpp_dense_", 40)


@pytest.mark.parametrize("name,rules_agree_before", [("hc2-allcells-ple-nk4", 40), ("hc2-qsa4-ple", 11), ("hc4-qsa8", 15)])
def test_qsa_matches_llama_cpp_where_the_rules_keep_the_same_cells(tmp_path, name, rules_agree_before):
    """llama.cpp keeps the budget + ratio - 1 best cells (a cell scores as its block; the tail forced
    in), transformers and this engine keep budget / ratio whole blocks and the tail. Both keep every
    cell while the context holds fewer than ratio * (budget / ratio + 1) tokens (12 at ratio 4 and
    budget 8, 16 at ratio 8), and agree up to there; past it llama.cpp keeps part of one more block
    (the fixtures part at exactly those positions). The all-cells case keeps everything throughout."""
    ref.make_checkpoint(name, tmp_path)
    assert_matches_llama_cpp(str(tmp_path), name, "llama_cpp_", rules_agree_before)


def test_config_errors_name_the_field(tmp_path):
    ref.make_checkpoint("hc4-qsa8", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["ple_layer_ids"] = [9]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="ple_layer_ids"):
        LLM(str(tmp_path), kv_cache_memory_bytes=16 << 20)


def test_awq_experts_match_transformers_on_the_dequantized_weights(tmp_path):
    """`revolta quantize --awq` of a Flash-Next checkpoint (experts per expert, as quantized
    checkpoints hold them): the engine against transformers on the dequantized weights."""
    from revolta.cli import main as revolta_cli
    from revolta.models.safetensors_io import read_safetensors
    from test_awq import awq_dequantize
    from test_quantized_hybrid import load_per_expert, per_expert

    src, out = tmp_path / "f32", tmp_path / "awq"
    model = ref.make_checkpoint("hc4-qsa8", src)
    per_expert(src)
    assert revolta_cli(["quantize", "--model", str(src), "--awq", "--group-size", "32", str(out)]) == 0
    t = read_safetensors(out / "model.safetensors")
    weights = {n[: -len(".qweight")] + ".weight": torch.from_numpy(np.ascontiguousarray(
        awq_dequantize(t[n], t[n[: -len("qweight")] + "qzeros"], t[n[: -len("qweight")] + "scales"])))
        for n in t if n.endswith(".qweight")}
    assert any(".experts." in n for n in weights) and any("shared_expert" in n for n in weights)
    load_per_expert(model, weights)
    with ref.ties_to_lower_block(), torch.no_grad():
        logits = model(torch.tensor([ref.PROMPT])).logits[0]
        expected = hf_greedy(model, ref.PROMPT, 12)
    with LLM(str(out), kv_cache_memory_bytes=16 << 20) as llm:
        assert llm.model_info.quantization
        first = llm.generate([ref.PROMPT], greedy(12, return_generation_logits=True))[0].outputs[0]
    assert (torch.tensor(first.generation_logits[0]) - logits[-1]).abs().max().item() < 1e-4
    assert list(first.token_ids) == expected


@pytest.mark.parametrize("layout", ["shards", "whole"])
def test_ple_table_from_host_memory_or_its_file_mapping(tmp_path, layout):
    """The PLE table read into host memory (ple_offload host) or left in the checkpoint's mapping
    (disk), stored as transformers saves it (shards) or as one tensor: the same logits as
    transformers either way."""
    from safetensors.torch import load_file, save_file

    model = ref.make_checkpoint("hc2-qsa4-ple", tmp_path)
    if layout == "whole":
        tensors = load_file(str(tmp_path / "model.safetensors"))
        base = "model.layers.0.ple.ple_embedding.ngram_embedding."
        shards = sorted((n for n in tensors if n.startswith(base + "shard_")), key=lambda n: int(n.split("_")[-1].split(".")[0]))
        assert len(shards) > 1
        tensors[base + "weight"] = torch.cat([tensors.pop(n) for n in shards])
        save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with ref.ties_to_lower_block(), torch.no_grad():
        expected = model(torch.tensor([ref.PROMPT])).logits[0, -1]
    for offload in ("host", "disk"):
        with LLM(str(tmp_path), kv_cache_memory_bytes=16 << 20, ple_offload=offload) as llm:
            out = llm.generate([ref.PROMPT], greedy(1, return_generation_logits=True))[0].outputs[0]
        err = (torch.tensor(out.generation_logits[0]) - expected).abs().max().item()
        assert err < 1e-4, f"ple_offload={offload}, {layout}: max |logit diff| {err}"


def test_a_large_step_gathers_its_ple_rows_on_another_thread(tmp_path):
    """Four 300-token prompts prefilled in one step hold 1,200 tokens of PLE rows (300 KB): their
    gather runs on a thread of its own while the layers before the PLE layer do (smaller steps
    gather in place). The tokens stay transformers'."""
    model = ref.make_checkpoint("hc2-qsa4-ple", tmp_path)
    prompts = [[(13 * i + 7 * j) % 500 + 3 for i in range(300)] for j in range(4)]
    with ref.ties_to_lower_block():
        expected = [hf_greedy(model, p, 4) for p in prompts]
    with LLM(str(tmp_path), kv_cache_memory_bytes=16 << 20, max_num_batched_tokens=2048) as llm:
        assert [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy(4))] == expected


def test_the_cache_budget_an_error_asks_for_is_enough(tmp_path):
    """A budget too small for one request of max_model_len beside the recurrent states names the
    least that holds both, and that figure is accepted."""
    import re

    ref.make_checkpoint("hc2-qsa4-ple", tmp_path)
    opts = dict(max_model_len=4096, max_num_seqs=8, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="fewer than one request of max_model_len") as err:
        LLM(str(tmp_path), kv_cache_memory_bytes=1 << 20, **opts)
    least = int(re.search(r"at least (\d+) bytes", str(err.value)).group(1))
    with LLM(str(tmp_path), kv_cache_memory_bytes=least, **opts) as llm:
        assert llm.generate([[5, 6, 7]], greedy(2))[0].outputs[0].token_ids
