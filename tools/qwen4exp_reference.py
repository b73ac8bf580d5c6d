"""Reference figures for tiny random Flash-Next (`qwen4_exp`) models, kept as test fixtures.

Two references nobody here wrote: HF transformers (5.25 ships `Qwen4ExpForCausalLM`) and llama.cpp
(the llama-cpp-python 0.3.36 sdist vendors its `qwen4exp` graph, the converter and the gguf-py
that knows the architecture). Each case is a tiny random model made by transformers from a seed
and saved as the released checkpoint is laid out (`make_checkpoint`; tests make the same files
without this script). transformers gives its prompt logits and greedy tokens; the checkpoint is then
converted by llama.cpp's converter and run by llama.cpp; both go to
tests/fixtures/qwen4exp/<case>.npz, with how far the two references are apart. For GGUF_CASES the
converted file (QSA on, float32) is kept too, as <case>.gguf: the engine reads it as a user's GGUF.

    pip install llama-cpp-python==0.3.36 torch numpy safetensors tokenizers transformers==5.25.0
    python tools/qwen4exp_reference.py [--cases a,b] [--sdist DIR]   (DIR: the unpacked sdist;
                                                                     default: downloaded by pip)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "qwen4exp"
EOS = 2
# 40 ids of the byte vocabulary with an EOS among them: PLE's n-gram window is cut there.
PROMPT = [(7 * i + 3) % 250 + 5 for i in range(40)]
PROMPT[23] = EOS
GREEDY_TOKENS = 32

# The smallest model that exercises every part: GDN and full (indexed) layers, hyper-connections,
# QSA, PLE on a linear layer, experts with a shared one. Cases override it.
BASE = dict(
    vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
    linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
    num_experts_per_tok=2, hc_count=2, hc_lowrank=8, ple_layer_ids=[1], ple_conv_kernel_size=3, ngram_size=3,
    heads_per_ngram=2, ngram_vocab_size_base=100, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2,
    indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    eos_token_id=EOS, bos_token_id=1, max_position_embeddings=4096, output_gate_type="sigmoid", rms_norm_eps=1e-6,
    tie_word_embeddings=False)

CASES = {
    "hc2-qsa4-ple": {},
    "hc4-qsa8": {"hc_count": 4, "indexer_compress_ratio": 8, "ple_layer_ids": [], "seed": 1},
    # a budget past the context keeps every cell: attention as dense (transformers has no ratio 0)
    "hc2-allcells-ple-nk4": {"indexer_budget": 256, "linear_num_key_heads": 4, "seed": 2},
}


# The cases whose llama.cpp GGUF is kept as a fixture (1.4 MB each).
GGUF_CASES = ["hc2-qsa4-ple"]


def config_of(case: str):
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

    kw = {**BASE, **{k: v for k, v in CASES[case].items() if k != "seed"}}
    return Qwen4ExpTextConfig(**kw)


def seed_of(case: str) -> int:
    return int(CASES[case].get("seed", 0))


def make_model(case: str):
    """The case's model: transformers' own initialisation, then every weight redrawn from the seed
    (small normal values; norm weights around their neutral value), so no part is a no-op."""
    import torch
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

    torch.manual_seed(seed_of(case))
    model = Qwen4ExpForCausalLM(config_of(case)).eval()
    g = torch.Generator().manual_seed(1000 + seed_of(case))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point():
                continue
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(p + 0.1 * noise)  # (zero-centred or one-centred as transformers made it)
            elif p.dim() >= 2:
                p.copy_(noise * p.shape[-1] ** -0.5)
            else:
                p.copy_(0.5 * noise)
    return model


@contextlib.contextmanager
def ties_to_lower_block(log: list | None = None):
    """transformers' QSA choice (its only 1-D topk) with the engine's stated tie rule; `log` gets
    each choice whose k-th and (k+1)-th scores tie."""
    import torch

    original = torch.Tensor.topk

    def topk(self, k, dim=None, **kw):
        if self.dim() != 1:
            return original(self, k, **({"dim": dim} if dim is not None else {}), **kw)
        values = self.tolist()
        order = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
        ranked = sorted(values, reverse=True)
        if log is not None and k < len(values) and ranked[k - 1] == ranked[k]:
            log.append((len(values), k))
        idx = torch.tensor(order, dtype=torch.long)
        return torch.return_types.topk((self[idx], idx))

    torch.Tensor.topk = topk
    try:
        yield
    finally:
        torch.Tensor.topk = original


def write_tokenizer(out: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer with a few merges (llama.cpp's gpt2 vocabulary needs one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("i", "n"), ("Ġt", "he")]:
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    for i in range(len(vocab), vocab_size):
        vocab[f"<extra_{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 4096}))


def make_checkpoint(case: str, out: Path):
    """The case's checkpoint in `out` (as save_pretrained lays it out, with a tokenizer); returns the model."""
    model = make_model(case)
    model.save_pretrained(str(out))
    write_tokenizer(out, model.config.vocab_size)
    return model


def hf_figures(model, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """Prompt logits [T, V] and n greedy tokens, from transformers."""
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
        out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return logits, out[0, len(prompt):].tolist()


def sdist_dir(given: str | None, work: Path) -> Path:
    if given:
        return Path(given)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "-d", str(work),
                    "llama-cpp-python==0.3.36"], check=True)
    archive = next(work.glob("llama_cpp_python-0.3.36.tar.gz"))
    subprocess.run(["tar", "xzf", str(archive), "-C", str(work)], check=True)
    return work / "llama_cpp_python-0.3.36"


def convert(ckpt: Path, sdist: Path, qsa: bool) -> Path:
    """The checkpoint as an f32 GGUF, by llama.cpp's converter (its pre-tokenizer check, which only
    knows released tokenizers, told to take this one as qwen2's). The converter gives a layer QSA
    (a compress ratio) only where layer_types says "full_attention", the released checkpoints'
    spelling, and reads the config through transformers when it can, which respells that as
    "indexed_attention": it is made to read config.json as written. qsa picks the spelling, so
    both forms of llama.cpp's attention can be run."""
    llama = sdist / "vendor" / "llama.cpp"
    out = ckpt / ("model-qsa-f32.gguf" if qsa else "model-dense-f32.gguf")
    config = json.loads((ckpt / "config.json").read_text())
    config["layer_types"] = [("full_attention" if qsa else "indexed_attention") if t != "linear_attention" else t
                             for t in config["layer_types"]]
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    script = (f"import sys, runpy; sys.path[:0] = [{str(llama / 'gguf-py')!r}, {str(llama)!r}]\n"
              "import conversion.base as b\n"
              # transformers 5.25's config respells full_attention as indexed_attention, which the
              # converter then writes as ratio 0 (dense): it must read config.json as written.
              "class _RawConfig:\n"
              "    @staticmethod\n"
              "    def from_pretrained(*a, **k): raise RuntimeError('read config.json as written')\n"
              "b.AutoConfig = _RawConfig\n"
              "for c in [c for c in vars(b).values() if isinstance(c, type) and hasattr(c, 'get_vocab_base_pre')]:\n"
              "    c.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
              f"sys.argv = ['convert_hf_to_gguf.py', {str(ckpt)!r}, '--outtype', 'f32', '--outfile', {str(out)!r}]\n"
              f"runpy.run_path({str(llama / 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=str(llama))
    return out


def llama_cpp_figures(gguf: Path, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """Prompt logits [T, V] and n greedy tokens, from llama.cpp."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=512, n_batch=512, logits_all=True, verbose=False, seed=0)
    llm.eval(prompt)
    logits = np.array(llm.scores[: len(prompt)], dtype=np.float32)
    tokens = []
    for _ in range(n):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        tokens.append(nxt)
        llm.eval([nxt])
    return logits, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--sdist", help="the unpacked llama-cpp-python 0.3.36 sdist (default: downloaded)")
    args = ap.parse_args(argv)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sdist = sdist_dir(args.sdist, work)
        for case in args.cases.split(","):
            model = make_checkpoint(case, work / case)
            hf_logits, hf_tokens = hf_figures(model, PROMPT, GREEDY_TOKENS)
            qsa_gguf = convert(work / case, sdist, qsa=True)
            if case in GGUF_CASES:
                shutil.copyfile(qsa_gguf, FIXTURES / f"{case}.gguf")
            qsa_logits, qsa_tokens = llama_cpp_figures(qsa_gguf, PROMPT, GREEDY_TOKENS)
            dense_logits, dense_tokens = llama_cpp_figures(convert(work / case, sdist, qsa=False), PROMPT, GREEDY_TOKENS)
            np.savez_compressed(FIXTURES / f"{case}.npz", prompt=np.array(PROMPT, dtype=np.int32),
                                hf_logits=hf_logits, hf_greedy=np.array(hf_tokens, dtype=np.int32),
                                llama_cpp_logits=qsa_logits, llama_cpp_greedy=np.array(qsa_tokens, dtype=np.int32),
                                llama_cpp_dense_logits=dense_logits,
                                llama_cpp_dense_greedy=np.array(dense_tokens, dtype=np.int32))
            gap = float(np.abs(hf_logits - qsa_logits).max())
            same = sum(a == b for a, b in zip(hf_tokens, qsa_tokens))
            print(f"{case}: transformers vs llama.cpp (QSA): prompt logits max |d| {gap:.2e}, "
                  f"greedy {same}/{GREEDY_TOKENS} equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
