"""Checks shared by the quantized-format tests: the engine against HF transformers running the
weights a checkpoint stands for, a checkpoint's copy under another quantization_config, and the
bytes its projections should take."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from conftest import hf_greedy, hf_last_logits
from revolta import SamplingParams


def assert_matches_hf(llm, model, prompts: list[list[int]], tokens: int) -> None:
    """Each prompt's first logits within 1e-4 of HF's, and `tokens` greedy tokens equal to HF's."""
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, return_generation_logits=True))
    for prompt, out in zip(prompts, outs):
        err = (torch.tensor(out.outputs[0].generation_logits[0]) - hf_last_logits(model, prompt)).abs().max().item()
        assert err < 1e-4, f"prompt of {len(prompt)} tokens: max |logit diff| {err}"
    greedy = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    assert got == [hf_greedy(model, p, tokens) for p in prompts]


def with_quantization_config(path: Path, out: Path, change) -> Path:
    """out: path's files (linked) with config.json's quantization_config passed through change()."""
    out.mkdir(exist_ok=True)
    for f in path.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = change(cfg["quantization_config"])
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def projection_values(model, block: int) -> tuple[int, int, int]:
    """(values of the projections whose K is a whole number of `block`-value blocks, of the other
    projections, of the embedding and head)."""
    projections = [p for n, p in model.named_parameters() if n.endswith("_proj.weight")]
    blocked = sum(p.numel() for p in projections if p.shape[1] % block == 0)
    heads = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" in n or "lm_head" in n)
    return blocked, sum(p.numel() for p in projections) - blocked, heads


def awq_cpu_and_gpu(src: Path, out: Path, group: int, cpu_dtype: str):
    """A module fixture's body: `revolta quantize --awq` of src into out, then the CPU engine (at
    cpu_dtype) and the GPU engine on it, yielded as a pair and shut down after."""
    import gc

    import revolta
    from revolta.cli import main as revolta_cli

    assert revolta_cli(["quantize", "--model", str(src), "--awq", "--group-size", str(group), str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["quantization_config"]["group_size"] == group
    cpu = revolta.LLM(str(out), dtype=cpu_dtype, max_model_len=1024, max_num_seqs=16)
    gpu = revolta.LLM(str(out), device="cuda", max_model_len=1024, gpu_memory_utilization=0.0, max_num_seqs=16)
    assert gpu.model_info.quantization == f"awq int4 g{group}"
    yield cpu, gpu
    cpu.engine.shutdown()
    gpu.engine.shutdown()
    del cpu, gpu
    gc.collect()


def token_prompts(n: int, seed: int, lengths=(5, 17, 130, 300, 9, 33, 2, 70)) -> list[dict]:
    """n prompts of random token ids cycling through `lengths` (decode-sized and past 64 tokens)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [{"prompt_token_ids": rng.integers(3, 256, size=lengths[i % len(lengths)]).tolist()} for i in range(n)]
