"""Tiny random checkpoints with a vision tower, written by HF transformers (Qwen3.5 with a dense or MoE
decoder, Qwen3-VL with deepstack), with the media and HF reference the multimodal tests share."""

from __future__ import annotations

import json

import numpy as np
import torch
import transformers

from conftest import save_byte_tokenizer

IMAGE, VIDEO, START, END = 290, 291, 292, 293
SPECIAL = [IMAGE, VIDEO, START, END]
TOP = 20


# Qwen3.5 (hybrid decoder, dense MLPs or experts); Qwen3-VL (deepstack; a dense or an MoE decoder)
KINDS = ("dense", "moe", "qwen3_vl", "qwen3_vl_moe")


def tiny_config(kind: str):
    ids = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16)
    if kind.startswith("qwen3_vl"):  # a Qwen3 decoder; the tower's blocks 0 and 1 feed decoder layers 0 and 1
        text = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                                     "mrope_interleaved": True})
        vision.update(deepstack_visual_indexes=[0, 1])
        if kind == "qwen3_vl_moe":
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
            return (transformers.Qwen3VLMoeConfig(text_config=text, vision_config=vision, **ids),
                    transformers.Qwen3VLMoeForConditionalGeneration)
        return transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **ids), transformers.Qwen3VLForConditionalGeneration
    text = dict(vocab_size=300, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=512, bos_token_id=1,
                eos_token_id=2,
                layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    if kind == "moe":
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
        from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe as c

        return c.Qwen3_5MoeConfig(text_config=text, vision_config=vision, **ids), transformers.Qwen3_5MoeForConditionalGeneration
    text.update(intermediate_size=96)
    return transformers.Qwen3_5Config(text_config=text, vision_config=vision, **ids), transformers.Qwen3_5ForConditionalGeneration


def make_model(out_dir, kind: str = "dense"):
    torch.manual_seed(KINDS.index(kind) + 3)
    cfg, cls = tiny_config(kind)
    model = cls(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "dt_bias" in name or "bias" in name or "pos_embed" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    save_vl_tokenizer(out_dir)
    (out_dir / "preprocessor_config.json").write_text(json.dumps(
        {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 256, "max_pixels": 64 * 64,
         "image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28]}))
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(
        {"patch_size": 4, "temporal_patch_size": 2, "merge_size": 2, "size": {"shortest_edge": 1024, "longest_edge": 4 * 64 * 64},
         "image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28], "fps": 2, "min_frames": 4, "max_frames": 64}))
    return model


def picture(seed: int, height: int, width: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def clip(seed: int, frames: int = 4):
    from revolta.multimodal.video import Video

    rng = np.random.default_rng(seed)
    return Video(rng.integers(0, 256, (frames, 24, 40, 3), dtype=np.uint8), fps=2.0)


def prompts():
    """(token ids with one placeholder per item, multi_modal_data)."""
    return [
        ([5, 6, START, IMAGE, END, 7, 8, 9], {"image": [picture(1, 40, 56)]}),
        ([10, START, IMAGE, END, 11, START, IMAGE, END, 12, 13, START, IMAGE, END, 14],
         {"image": [picture(2, 32, 32), picture(3, 57, 23), picture(4, 64, 48)]}),
        ([15, 16, START, VIDEO, END, 17, 18], {"video": [clip(5)]}),
    ]


def hf_inputs(llm, ids, data):
    """HF's inputs for the prompt the engine runs: its expanded ids and the same pixel rows."""
    expanded, media = llm.multimodal.expand(ids, data.get("image", []), data.get("video", []))
    kw = {"input_ids": torch.tensor([expanded]),
          "mm_token_type_ids": torch.tensor([[1 if t == IMAGE else 2 if t == VIDEO else 0 for t in expanded]])}
    images = [llm.multimodal.image(i) for i in data.get("image", [])]
    if images:
        kw["pixel_values"] = torch.from_numpy(np.concatenate([p.pixel_values for p in images]))
        kw["image_grid_thw"] = torch.tensor([p.grid_thw for p in images])
    videos = [llm.multimodal.video(v)[0] for v in data.get("video", [])]
    if videos:
        kw["pixel_values_videos"] = torch.from_numpy(np.concatenate([p.pixel_values for p in videos]))
        kw["video_grid_thw"] = torch.tensor([p.grid_thw for p in videos])
    return expanded, kw


@torch.no_grad()
def hf_reference(model, kw, steps: int):
    """HF's log-probabilities over the prompt and its greedy continuation (full forwards)."""
    ids = kw["input_ids"][0].tolist()
    logp = torch.log_softmax(model(**kw).logits[0].double(), -1)
    out = []
    for _ in range(steps):
        k = dict(kw, input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([kw["mm_token_type_ids"][0].tolist() + [0] * len(out)]))
        row = model(**k).logits[0, -1]
        row[SPECIAL] -= 100.0  # as the engine's logit_bias: no media token is generated
        nxt = int(row.argmax())
        out.append(nxt)
        ids.append(nxt)
    return logp, out


# ChatML whose image / video parts become Qwen3.5's placeholders (as its template writes them).
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string %}{{ m.content }}{%- else %}{%- for p in m.content %}"
    "{%- if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif p.type == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- else %}{{ p.text }}{%- endif %}{%- endfor %}{%- endif %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def save_vl_tokenizer(out_dir) -> None:
    """A byte-level tokenizer below id 280 with the vision specials at the model's ids (290-293),
    ChatML's after them, and TEMPLATE as its chat template."""
    from tokenizers import AddedToken, Tokenizer

    save_byte_tokenizer(out_dir, vocab_size=280)
    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    fill = [f"<|reserved_{i}|>" for i in range(tok.get_vocab_size(), 290)]
    names = fill + ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_start|>", "<|im_end|>"]
    tok.add_special_tokens([AddedToken(n, special=True) for n in names])
    assert tok.token_to_id("<|image_pad|>") == IMAGE and tok.token_to_id("<|vision_end|>") == END
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "bos_token": None}))


def mp4(seed: int, frames: int = 12, rate: int = 10, height: int = 24, width: int = 40) -> bytes:
    """An encoded video (MPEG-4 part 2 in MP4, through PyAV) of random frames."""
    import io

    import av

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        s = c.add_stream("mpeg4", rate=rate)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), format="rgb24")
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()
