"""Checkpoint layouts of the MoE / hybrid family: fused expert tensors (transformers 5), the
multimodal Qwen3.5 wrapper (vision weights skipped), MTP weights kept. (Router tie-breaking is a
C++ unit test: torch.topk does not define an order for ties, so HF cannot be the reference.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from conftest import hf_last_logits, make_hf_model
from revolta import LLM, SamplingParams

PROMPT = list(range(3, 83))
NEXT = dict(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, head_dim=16)


def logits(path, tp: int = 1) -> torch.Tensor:
    with LLM(str(path), kv_cache_memory_bytes=16 << 20, max_model_len=256, tensor_parallel_size=tp) as llm:
        out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=1, return_generation_logits=True))
    return torch.tensor(out[0].outputs[0].generation_logits[0])


@pytest.fixture(scope="module")
def next_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("next")
    return make_hf_model("qwen3_next", path, seed=21, **NEXT), path


def test_fused_expert_tensors(next_model, tmp_path):
    model, path = next_model
    ref = hf_last_logits(model, PROMPT)
    tensors = load_file(str(path / "model.safetensors"))
    fused = {}
    for name in list(tensors):
        if ".mlp.experts.0.gate_proj.weight" in name:
            prefix = name.split("experts.0.")[0] + "experts."
            E = model.config.num_experts
            gate = [tensors.pop(f"{prefix}{e}.gate_proj.weight") for e in range(E)]
            up = [tensors.pop(f"{prefix}{e}.up_proj.weight") for e in range(E)]
            down = [tensors.pop(f"{prefix}{e}.down_proj.weight") for e in range(E)]
            fused[prefix + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up)])
            fused[prefix + "down_proj"] = np.stack(down)
    assert fused and not any(".experts.0." in n for n in tensors)
    out = tmp_path / "fused"
    shutil.copytree(path, out)
    save_file({**tensors, **fused}, str(out / "model.safetensors"))
    assert (logits(out) - ref).abs().max().item() < 1e-4
    # Two ranks read their rows of each expert's gate / up and columns of its down from the 3-D tensors.
    assert (logits(out, tp=2) - ref).abs().max().item() < 1e-4


def test_multimodal_wrapper_and_mtp_weights(tmp_path, capfd):
    import tiny_mtp

    model = make_hf_model("qwen3_5_moe", tmp_path / "text", seed=22, **NEXT)
    head = tiny_mtp.add_random_mtp(model, tmp_path / "text", seed=23)
    tensors = load_file(str(tmp_path / "text" / "model.safetensors"))
    wrapped = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): v for n, v in tensors.items()}
    wrapped["model.visual.patch_embed.proj.weight"] = np.zeros((4, 4), np.float32)
    mtp = load_file(str(tmp_path / "text" / "mtp.safetensors"))
    out = tmp_path / "wrapped"
    out.mkdir()
    save_file(wrapped | mtp, str(out / "model.safetensors"))
    text_cfg = json.loads((tmp_path / "text" / "config.json").read_text())
    # (no vision_config: the tower's tensors in the file are left alone; tests/test_multimodal.py runs towers)
    cfg = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "text_config": text_cfg, "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(cfg))
    assert (logits(out) - hf_last_logits(model, PROMPT)).abs().max().item() < 1e-4
    err = capfd.readouterr().err
    assert "1 multi-token-prediction layer(s) (mtp.*) ready" in err
    # The MTP layer's matrices are counted with the weights (the memory plan sees them), at the
    # weights' dtype, as a decoder layer's are (norms and the router, kept in float32, are not).
    plain = tmp_path / "no_mtp"
    shutil.copytree(out, plain)
    save_file(wrapped, str(plain / "model.safetensors"))
    no_mtp = dict(cfg, text_config={k: v for k, v in text_cfg.items() if k != "mtp_num_hidden_layers"})
    (plain / "config.json").write_text(json.dumps(no_mtp))
    counted = sum(p.numel() for n, p in tiny_mtp.own_parameters(head)
                  if p.dim() >= 2 and not n.endswith(("mlp.gate.weight", "shared_expert_gate.weight")))
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        with LLM(str(out), dtype=dtype, kv_cache_memory_bytes=16 << 20, max_model_len=256) as a, \
                LLM(str(plain), dtype=dtype, kv_cache_memory_bytes=16 << 20, max_model_len=256) as b:
            assert a.model_info.weight_bytes - b.model_info.weight_bytes == counted * size
