"""Images and video through the engine against HF transformers: tiny random Qwen3.5 checkpoints
with a vision tower (a dense and an MoE decoder), prompts with one image, three images of different
sizes and a short video. Prompt log-probabilities (each token's and the top 20) within 1e-4 of
HF's, greedy tokens equal to HF's, under concurrency and chunked prefill that splits media spans;
the encoder cache, media-keyed prefix caching and the step's encoder budget."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_vl import END, IMAGE, KINDS, SPECIAL, START, TOP, hf_inputs, hf_reference, make_model, picture, prompts  # noqa: E402


@pytest.fixture(scope="module", params=list(KINDS))
def case(request, tmp_path_factory):
    import revolta

    d = tmp_path_factory.mktemp(f"qwen3_5_vl_{request.param}")
    model = make_model(d, request.param)
    llm = revolta.LLM(str(d), dtype="float32", max_model_len=256, max_num_seqs=8)
    refs = []
    for ids, data in prompts():
        expanded, kw = hf_inputs(llm, ids, data)
        refs.append((expanded, *hf_reference(model, kw, 6)))
    yield d, llm, refs, model
    llm.shutdown()


def check_prompt(out, expanded, logp):
    """Every prompt position's token and top-20 log-probabilities within 1e-4 of HF's."""
    got = out.prompt_logprobs
    assert out.prompt_token_ids == expanded
    assert got[0] is None and len(got) == len(expanded)
    worst = 0.0
    for i in range(1, len(expanded)):
        row = logp[i - 1]
        top = set(torch.topk(row, TOP).indices.tolist())
        for tok, lp in got[i].items():
            worst = max(worst, abs(lp - float(row[tok])))
        assert expanded[i] in got[i]
        assert len(top & set(got[i])) >= TOP - 2  # near-ties at the 20th place may swap
    assert worst < 1e-4, worst


def sampling(**kw):
    import revolta

    return revolta.SamplingParams(**{"temperature": 0.0, "max_tokens": 6, "ignore_eos": True, "prompt_logprobs": TOP,
                                     "logit_bias": {t: -100.0 for t in SPECIAL}, **kw})


def test_prompt_logprobs_and_greedy_tokens_match_hf(case):
    _, llm, refs, _ = case
    for (ids, data), (expanded, logp, greedy) in zip(prompts(), refs):
        out = llm.generate({"prompt_token_ids": ids, "multi_modal_data": data}, sampling())[0]
        check_prompt(out, expanded, logp)
        assert out.outputs[0].token_ids == greedy


def test_concurrent_requests_with_chunks_splitting_media(case):
    """All prompts at once, twice each, plus a text-only one, in 8-token steps: an image's span
    (at least 4 tokens) and the video's frame groups are computed across chunks."""
    import revolta

    d, _, refs, _ = case
    text = [20, 21, 22, 23, 24, 25]
    with revolta.LLM(str(d), dtype="float32", max_model_len=256, max_num_seqs=8, max_num_batched_tokens=8,
                     enable_prefix_caching=False) as llm:
        batch = [{"prompt_token_ids": ids, "multi_modal_data": data} for ids, data in prompts()] * 2
        outs = llm.generate(batch + [{"prompt_token_ids": text}], sampling())
        assert llm.engine.stats().mm_items_encoded == 6  # 1 + 3 images, 2 frame groups; repeats from the cache
    for out, (expanded, logp, greedy) in zip(outs, refs + refs):
        check_prompt(out, expanded, logp)
        assert out.outputs[0].token_ids == greedy
    assert len(outs[-1].outputs[0].token_ids) == 6


def test_same_text_other_image_shares_no_blocks(case):
    """Prefix caching keys media by content: the same text with another image is a miss from the
    block holding the image on, and answers as HF does; the same image again is a hit past it; the
    same image after other text is encoded from the encoder cache, not by the vision tower."""
    import revolta

    d, llm0, _, hf = case
    ids = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, START, IMAGE, END] + list(range(30, 60))
    a, b = picture(11, 40, 40), picture(12, 40, 40)
    plain = sampling(prompt_logprobs=None)  # (prompt log-probabilities read no cached block)
    with revolta.LLM(str(d), dtype="float32", max_model_len=256, block_size=16) as llm:
        first = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": [a]}}, plain)[0]
        encoded = llm.engine.stats().mm_items_encoded
        other = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": [b]}}, plain)[0]
        # no block from the image's on (a hybrid model's hits stop at a state snapshot: none here)
        assert other.num_cached_tokens <= 16
        again = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": [a]}}, plain)[0]
        assert again.num_cached_tokens == 64  # past the image, up to the last full block's snapshot
        assert llm.engine.stats().mm_items_encoded == encoded + 1  # b only: a's span came from the blocks
        # other text before image a: no prefix hit, and the encoder cache has a's tokens
        moved = llm.generate({"prompt_token_ids": [40] + ids, "multi_modal_data": {"image": [a]}}, plain)[0]
        stats = llm.engine.stats()
        assert moved.num_cached_tokens == 0
        assert stats.mm_items_encoded == encoded + 1 and stats.mm_encoder_cache_hits == 1
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    _, kw = hf_inputs(llm0, [40] + ids, {"image": [a]})
    assert moved.outputs[0].token_ids == hf_reference(hf, kw, 6)[1]
    assert other.prompt_token_ids == first.prompt_token_ids
    for out, image in ((first, a), (other, b)):
        _, kw = hf_inputs(llm0, ids, {"image": [image]})
        assert out.outputs[0].token_ids == hf_reference(hf, kw, 6)[1]


def test_encoder_budget_spreads_images_over_steps(case):
    """With a budget of one image's tokens, a prompt with three images is encoded over three steps
    (each chunk stops before the next image), and answers exactly as in one step."""
    import revolta

    d, _, refs, _ = case
    ids, data = prompts()[1]
    expanded, logp, greedy = refs[1]
    # the images take 16, 21 and 48 tokens: a budget of 16 takes one a step (a larger one alone)
    with revolta.LLM(str(d), dtype="float32", max_model_len=256, max_num_encoder_input_tokens=16,
                     enable_prefix_caching=False) as llm:
        out = llm.generate({"prompt_token_ids": ids, "multi_modal_data": data}, sampling(max_tokens=1))[0]
        stats = llm.engine.stats()
        assert stats.mm_items_encoded == 3
        assert stats.num_steps >= 3
    check_prompt(out, expanded, logp)
    assert out.outputs[0].token_ids == greedy[:1]


def test_media_errors_name_the_item(case):
    from revolta import _core

    _, llm, _, _ = case
    with pytest.raises(ValueError, match="2 image placeholders for 1 images"):
        llm.generate({"prompt_token_ids": [START, IMAGE, END, IMAGE], "multi_modal_data": {"image": [picture(1, 32, 32)]}})
    with pytest.raises(ValueError, match="unknown modality"):
        llm.generate({"prompt_token_ids": [5], "multi_modal_data": {"audio": [b""]}})
    bad = _core.MediaInput("image", "h", 1, 1, 4, 4, np.zeros((16, 5), np.float32))
    sp = _core.SamplingParams()
    with pytest.raises(ValueError, match="media item 0 .* pixel values for 16 patches"):
        llm.engine.add_request([START] + [IMAGE] * 4 + [END], sp, media=[bad])
    wrong_place = _core.MediaInput("image", "h", 0, 1, 4, 4, np.zeros((16, 96), np.float32))
    with pytest.raises(ValueError, match="not the image placeholder"):
        llm.engine.add_request([START] + [IMAGE] * 4 + [END], sp, media=[wrong_place])
    # the engine goes on serving
    out = llm.generate({"prompt_token_ids": prompts()[0][0], "multi_modal_data": prompts()[0][1]}, sampling(max_tokens=1))
    assert len(out[0].outputs[0].token_ids) == 1


def test_language_model_only_skips_the_tower(case):
    """language_model_only: no vision tower is loaded, a text prompt answers as with the tower, media
    are refused; the server's --limit-mm-per-prompt of zero for both modalities selects it."""
    import revolta
    from revolta.server.media import no_media_allowed

    d, full, _, _ = case
    text = {"prompt_token_ids": [5, 6, 7, 8, 9, 10]}
    want = full.generate(text, sampling(prompt_logprobs=None))[0].outputs[0].token_ids
    assert full.model_info.takes_media
    with revolta.LLM(str(d), dtype="float32", max_model_len=256, language_model_only=True) as llm:
        assert not llm.model_info.takes_media and llm.multimodal is None
        assert llm.generate(text, sampling(prompt_logprobs=None))[0].outputs[0].token_ids == want
        with pytest.raises(ValueError, match="no vision tower loaded"):
            llm.generate({"prompt_token_ids": prompts()[0][0], "multi_modal_data": prompts()[0][1]})
    assert no_media_allowed({"image": 0, "video": 0})
    assert not no_media_allowed(None) and not no_media_allowed({"image": 0, "video": 1})
    assert not no_media_allowed({"image": 0})  # a modality left out is allowed


def test_text_only_model_refuses_media(tmp_path):
    import revolta
    from conftest import make_hf_model

    make_hf_model("qwen3", tmp_path)
    with revolta.LLM(str(tmp_path), dtype="float32", max_model_len=64) as llm:
        with pytest.raises(ValueError, match="no vision tower"):
            llm.generate({"prompt_token_ids": [5, 6], "multi_modal_data": {"image": [picture(1, 32, 32)]}})
        bad = revolta._core.MediaInput("image", "h", 0, 1, 4, 4, np.zeros((16, 96), np.float32))
        with pytest.raises(ValueError, match="takes text only"):
            llm.engine.add_request([5, 6], revolta._core.SamplingParams(), media=[bad])


def test_vision_tower_matches_hf_on_a_large_frame(case):
    """The tower alone on frames past one attention tile (400 and 4 x 96 patches), against HF's."""
    from revolta import _core

    from revolta.multimodal.image import patchify

    d, llm, _, hf = case
    rng = np.random.default_rng(7)  # normalised frames past the budget of preprocessing
    images = [patchify(rng.standard_normal((1, 3, h, w), dtype=np.float32), llm.multimodal.processing)
              for h, w in ((80, 80), (96, 16))]
    rows = np.concatenate([p.pixel_values for p in images])
    grids = [p.grid_thw for p in images]
    got = _core.ops.vision_encode(str(d), rows, grids)
    with torch.no_grad():
        out = hf.model.get_image_features(torch.from_numpy(rows), torch.tensor(grids), return_dict=True)
    # the merger's tokens, then each deepstack layer's (Qwen3-VL), side by side
    parts = [torch.cat(out.pooler_output)] + [torch.cat(f) for f in getattr(out, "deepstack_features", None) or []]
    ref = torch.cat(parts, dim=1).numpy()
    assert got.shape == ref.shape and grids[0] == (1, 20, 20)
    assert np.abs(got - ref).max() < 1e-4


def room_for_one(hf, max_len: int, seqs: int, block: int = 16) -> int:
    """KV-cache bytes that hold one longest request (and every request's recurrent state), not all."""
    from types import SimpleNamespace

    from conftest import state_bytes_per_slot

    c = hf.config.text_config
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    per_token = sum(t == "full_attention" for t in types) * 2 * c.num_key_value_heads * c.head_dim * 4
    return (-(-max_len // block) + 1) * block * per_token + 2 * seqs * state_bytes_per_slot(SimpleNamespace(config=c))


def test_tensor_parallel_ranks_and_preemption(case):
    """Two CPU ranks (each its share of the heads, media rows read by both) and a KV cache so small
    that prompts with images are preempted and recomputed: the same greedy tokens as HF's."""
    import revolta

    d, _, refs, hf = case
    batch = [{"prompt_token_ids": ids, "multi_modal_data": data} for ids, data in prompts()] * 2
    plain = sampling(prompt_logprobs=None)
    with revolta.LLM(str(d), dtype="float32", max_model_len=256, tensor_parallel_size=2) as llm:
        for out, (_, _, greedy) in zip(llm.generate(batch, plain), refs + refs):
            assert out.outputs[0].token_ids == greedy
    max_len, seqs = max(len(r[0]) for r in refs) + 33, 4
    with revolta.LLM(str(d), dtype="float32", max_model_len=max_len, max_num_seqs=seqs, block_size=16,
                     kv_cache_memory_bytes=room_for_one(hf, max_len, seqs)) as llm:
        outs = llm.generate(batch, sampling(prompt_logprobs=None, max_tokens=32))  # decodes that outgrow the pool
        preempted = llm.engine.stats().num_preemptions
    for out, (_, _, greedy) in zip(outs, refs + refs):
        assert out.outputs[0].token_ids[:len(greedy)] == greedy
    assert preempted > 0


def test_video_file_is_sampled_and_answers_as_its_frames(case):
    """A video file's bytes: decoded with PyAV, 4 frames sampled from 12 at 10 frames a second
    (2 a second, at least 4), two frame groups with their timestamps; the same answer as the sampled
    frames given with their times."""
    from revolta.multimodal.video import Video, decode_video
    from tiny_vl import VIDEO, mp4

    _, llm, _, _ = case
    data = mp4(3)
    v = decode_video(data)
    assert len(v.frames) == 4 and v.times == pytest.approx([0.0, 0.4, 0.7, 1.1])
    ids = [15, START, VIDEO, END, 16]
    a = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"video": [data]}}, sampling(prompt_logprobs=None))[0]
    b = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"video": [Video(v.frames, times=v.times)]}},
                     sampling(prompt_logprobs=None))[0]
    assert a.prompt_token_ids == b.prompt_token_ids and a.prompt_token_ids.count(START) == 2
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    with pytest.raises(ValueError, match="could not be decoded"):
        llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"video": [data[: len(data) // 3]]}})


def test_ngram_speculation_over_media_prompts(case):
    """n-gram drafts verified on media prompts (decode positions past the media shifted by their
    delta; hybrid states rolled back after rejected drafts): HF's greedy tokens."""
    import revolta

    d, llm0, _, hf = case
    batch = [{"prompt_token_ids": ids, "multi_modal_data": data} for ids, data in prompts()]
    with revolta.LLM(str(d), dtype="float32", max_model_len=256,
                     speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}) as llm:
        outs = llm.generate(batch, sampling(prompt_logprobs=None, max_tokens=30))  # long enough to repeat itself
        drafted = llm.engine.stats().spec_num_draft_tokens
    for out, (ids, data) in zip(outs, prompts()):
        assert out.outputs[0].token_ids == hf_reference(hf, hf_inputs(llm0, ids, data)[1], 30)[1]
    assert drafted > 0
