"""Flash-Next (`qwen4exp`) GGUF files as llama.cpp's converter writes them, mapped back onto the
checkpoint's own names and values: the config from the GGUF keys, and per tensor the inverse of
what the converter did (norm gammas stored as 1 + w, `ssm_a` = -exp(A_log), DeltaNet V heads
reordered from grouped to tiled when there are fewer key heads than value heads, the indexer's q / k
projection split in two, experts stacked per projection, convolution kernels squeezed, the PLE
table's shards joined and its hash constants moved to keys).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

ARCH = "qwen4exp"

# GGUF name (after "blk.N.") -> checkpoint name (after "model.layers.N.").
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "indexer.q_norm": "self_attn.indexer.q_layernorm",
    "indexer.k_norm": "self_attn.indexer.k_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_out": "linear_attn.out_proj",
    "ssm_norm": "linear_attn.norm",
    "ssm_conv1d": "linear_attn.conv1d",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ple_key": "ple.key_proj",
    "ple_value": "ple.value_proj",
    "ple_norm_key": "ple.norm_key",
    "ple_norm_query": "ple.norm_query",
    "ple_norm_conv": "ple.norm_conv",
    "ple_conv1d": "ple.conv1d",
}
for _x, _hf in (("attn", "attn_hyper_connection"), ("ffn", "mlp_hyper_connection")):
    _LAYER.update({f"hc_{_x}_norm": f"{_hf}.hc_norm", f"hc_{_x}_down": f"{_hf}.input_mix_weight_down",
                   f"hc_{_x}_up": f"{_hf}.input_mix_weight_up", f"hc_{_x}_inject": f"{_hf}.block_inject_weight"})
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_hc_norm.weight": "model.hyper_connection_mixer.hc_norm.weight",
    "output_hc_down.weight": "model.hyper_connection_mixer.input_mix_weight_down.weight",
    "output_hc_up.weight": "model.hyper_connection_mixer.input_mix_weight_up.weight",
}
# Gammas the converter stored as 1 + w (every RMSNorm but the DeltaNet's gated one).
_ONE_PLUS = ("hc_norm", "q_norm", "k_norm", "q_layernorm", "k_layernorm", "norm_key", "norm_query", "norm_conv")


class Qwen4ExpGGUFError(ValueError):
    pass


def config(field: Callable, tensors: dict, tokens: int) -> dict:
    """transformers' Qwen4ExpTextConfig fields from the GGUF keys (`field(key, default)`)."""
    def key(name, default=None):
        v = field(f"{ARCH}.{name}", default)
        if v is None:
            raise Qwen4ExpGGUFError(f"GGUF key {ARCH}.{name} is missing")
        return v

    n_layer = int(key("block_count"))
    head_dim = int(key("attention.key_length"))
    recurrent = list(key("attention.recurrent_layers"))
    ratios = [int(r) for r in field(f"{ARCH}.attention.compress_ratios", [0] * n_layer)]
    qsa = sorted({r for r, rec in zip(ratios, recurrent) if not rec and r > 0})
    dense = any(r == 0 for r, rec in zip(ratios, recurrent) if not rec)
    if len(qsa) > 1 or (qsa and dense):
        raise Qwen4ExpGGUFError(f"GGUF {ARCH}.attention.compress_ratios {ratios}: the engine takes one ratio for "
                                "every full-attention layer")
    n_rot = int(key("rope.dimension_count"))
    sections = [int(s) for s in field(f"{ARCH}.rope.dimension_sections", [11, 11, 10, 0])]
    nv = int(key("ssm.time_step_rank"))
    cfg = {
        "architectures": ["Qwen4ExpForCausalLM"],
        "model_type": "qwen4_exp_text",
        "vocab_size": int(tensors["token_embd.weight"].shape[1]) if "token_embd.weight" in tensors else tokens,
        "hidden_size": int(key("embedding_length")),
        "num_hidden_layers": n_layer,
        "num_attention_heads": int(key("attention.head_count")),
        "num_key_value_heads": int(key("attention.head_count_kv")),
        "head_dim": head_dim,
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(field(f"{ARCH}.rope.freq_base", 10000.0)),
                            "partial_rotary_factor": n_rot / head_dim, "mrope_section": sections[:3],
                            "mrope_interleaved": True},
        "layer_types": ["linear_attention" if rec else ("indexed_attention" if qsa else "full_attention")
                        for rec in recurrent],
        "linear_conv_kernel_dim": int(key("ssm.conv_kernel")),
        "linear_key_head_dim": int(key("ssm.state_size")),
        "linear_value_head_dim": int(key("ssm.inner_size")) // nv,
        "linear_num_key_heads": int(key("ssm.group_count")),
        "linear_num_value_heads": nv,
        "output_gate_type": "sigmoid",
        "hc_count": int(key("hyper_connection.count")),
        "hc_lowrank": int(key("hyper_connection.low_rank")),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float32",
    }
    if qsa:
        cfg.update(indexer_n_heads=int(key("attention.indexer.head_count")),
                   indexer_head_dim=int(key("attention.indexer.key_length")),
                   indexer_budget=int(key("attention.indexer.top_k")), indexer_compress_ratio=qsa[0], indexer_kv_heads=1)
    if field(f"{ARCH}.expert_count", 0):
        cfg.update(num_experts=int(key("expert_count")), num_experts_per_tok=int(key("expert_used_count")),
                   moe_intermediate_size=int(key("expert_feed_forward_length")),
                   shared_expert_intermediate_size=int(field(f"{ARCH}.expert_shared_feed_forward_length", 0)),
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    else:
        cfg.update(num_experts=0, intermediate_size=int(key("feed_forward_length")))
    ple = [int(x) for x in field(f"{ARCH}.ple.layers", [])]
    if ple:
        n, per = int(key("ple.ngram_size")), int(key("ple.heads_per_ngram"))
        row = int(key("embedding_length_per_layer_input"))
        cfg.update(ple_layer_ids=[i + 1 for i in ple], ngram_size=n, heads_per_ngram=per,
                   ple_conv_kernel_size=int(key("ple.conv_kernel")), ple_embed_dim=row * (n - 1) * per,
                   split_ngram_parts=1)
    return cfg


def _tiled_to_grouped(a: np.ndarray, axis: int, nk: int, nv: int, head: int) -> np.ndarray:
    """Undoes the converter's V-head reorder along `axis` (length nv * head): tiled order
    [G0v0, G1v0, ..., G0v1, ...] back to grouped [G0v0, G0v1, ..., G1v0, ...]."""
    if nk == nv:
        return a
    a = np.moveaxis(a, axis, 0)
    shape = a.shape
    a = a.reshape(nv // nk, nk, head, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.moveaxis(a, 0, axis)


def tensors(reader_tensors: dict, cfg: dict, field: Callable, dequantized: Callable) -> list:
    """(checkpoint name, shape, dtype, produce) for every tensor of the checkpoint the GGUF holds;
    `dequantized(tensor)` gives a GGUF tensor as float32 in numpy's shape."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    out: list = []

    def array(name: str) -> np.ndarray:
        return dequantized(reader_tensors[name])

    def add(hf: str, shape: tuple, produce: Callable[[], np.ndarray], dtype=np.float32):
        out.append((hf, tuple(int(s) for s in shape), dtype, produce))

    def ggml_shape(name: str) -> tuple:
        return tuple(int(s) for s in reversed(reader_tensors[name].shape.tolist()))

    used = set()
    for name in reader_tensors:
        if name in _GLOBAL:
            used.add(name)
            hf = _GLOBAL[name]
            add(hf, ggml_shape(name), lambda n=name, hf=hf: array(n) - 1 if _one_plus(hf) else array(n))
    for name in sorted(reader_tensors):
        if not name.startswith("blk."):
            continue
        _, bid, rest = name.split(".", 2)
        base, suffix = (rest.rsplit(".", 1) if rest.endswith((".weight", ".bias")) else (rest, ""))
        layer = f"model.layers.{bid}."
        if base in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            proj = base.split("_")[1] + "_proj"
            stacked = ggml_shape(name)
            for e in range(stacked[0]):
                add(f"{layer}mlp.experts.{e}.{proj}.weight", stacked[1:], lambda n=name, e=e: array(n)[e])
        elif base in ("indexer.q_proj", "indexer.k_proj"):
            if base == "indexer.q_proj":
                q, k = name, name.replace("indexer.q_proj", "indexer.k_proj")
                rows = ggml_shape(q)[0] + ggml_shape(k)[0]
                add(f"{layer}self_attn.indexer.index_qk_proj.weight", (rows, ggml_shape(q)[1]),
                    lambda q=q, k=k: np.concatenate([array(q), array(k)]))
        elif base == "ssm_a":
            add(f"{layer}linear_attn.A_log", ggml_shape(name),
                lambda n=name: _tiled_to_grouped(np.log(-array(n)), 0, nk, nv, 1))
        elif base == "ssm_dt" and suffix == "bias":
            add(f"{layer}linear_attn.dt_bias", ggml_shape(name),
                lambda n=name: _tiled_to_grouped(array(n), 0, nk, nv, 1))
        elif base in _LAYER and suffix == "weight":
            hf = f"{layer}{_LAYER[base]}.weight"
            shape = ggml_shape(name)
            if base in ("ssm_conv1d", "ple_conv1d"):
                shape = (shape[0], 1, shape[1])
            add(hf, shape, lambda n=name, b=base, hf=hf, shape=shape: _restore(array(n), b, hf, shape, nk, nv, dk, dv))
        else:
            raise Qwen4ExpGGUFError(f"GGUF tensor '{name}' has no Flash-Next counterpart")
        used.add(name)
    if "per_layer_token_embd.weight" in reader_tensors:
        (layer,) = cfg["ple_layer_ids"]
        p = f"model.layers.{layer - 1}.ple.ple_embedding."
        add(p + "ngram_embedding.weight", ggml_shape("per_layer_token_embd.weight"),
            lambda: array("per_layer_token_embd.weight"))
        for key, hf in (("layer_multipliers", "layer_multipliers"), ("head_offsets", "ngram_heads_offsets"),
                        ("head_vocab_sizes", "ngram_heads_vocab_sizes")):
            values = np.array([int(v) for v in field(f"{ARCH}.ple.{key}")], dtype=np.uint64).astype(np.int64)
            add(p + hf, values.shape, lambda v=values: v, np.int64)
        used.add("per_layer_token_embd.weight")
    left = sorted(set(reader_tensors) - used)
    if left:
        raise Qwen4ExpGGUFError(f"GGUF tensors with no Flash-Next counterpart: {', '.join(left[:5])}")
    return out


def _one_plus(hf: str) -> bool:
    return any(hf.endswith(f".{n}.weight") for n in _ONE_PLUS)


def _restore(w: np.ndarray, base: str, hf: str, shape: tuple, nk: int, nv: int, dk: int, dv: int) -> np.ndarray:
    if _one_plus(hf):
        w = w - 1
    if base == "attn_qkv":
        qk = 2 * nk * dk
        w = np.concatenate([w[:qk], _tiled_to_grouped(w[qk:], 0, nk, nv, dv)])
    elif base == "attn_gate":
        w = _tiled_to_grouped(w, 0, nk, nv, dv)
    elif base in ("ssm_alpha", "ssm_beta"):
        w = _tiled_to_grouped(w, 0, nk, nv, 1)
    elif base == "ssm_out":
        w = _tiled_to_grouped(w, 1, nk, nv, dv)
    elif base == "ssm_conv1d":
        qk = 2 * nk * dk
        w = np.concatenate([w[:qk], _tiled_to_grouped(w[qk:], 0, nk, nv, dv)])
    return np.ascontiguousarray(w).reshape(shape)
