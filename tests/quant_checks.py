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
