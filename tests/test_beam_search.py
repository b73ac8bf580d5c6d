"""Beam search (LLM.beam_search, vLLM's BeamSearchParams) against transformers' own beam search on a
tiny random model: the same beams in the same order with the same scores, with and without EOS
ending some of them, and with a length penalty."""

from __future__ import annotations

import pytest
import torch
import transformers

from revolta import LLM, BeamSearchParams, beam_search
from conftest import make_hf_model

PROMPTS = [[5, 17, 99, 3, 42], [7, 7, 8, 120, 64, 33, 2, 9]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("beam")
    hf = make_hf_model("llama", path, seed=3)
    llm = LLM(str(path), max_model_len=128, enable_prefix_caching=True)
    yield hf, llm
    llm.shutdown()


@torch.no_grad()
def hf_beams(hf, prompt, width, n, eos, length_penalty=1.0):
    cfg = transformers.GenerationConfig(num_beams=width, num_return_sequences=width, max_new_tokens=n, do_sample=False,
                                        early_stopping=False, length_penalty=length_penalty, eos_token_id=eos,
                                        pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    out = hf.generate(torch.tensor([prompt]), generation_config=cfg)
    seqs = []
    for row, score in zip(out.sequences.tolist(), out.sequences_scores.tolist()):
        gen = row[len(prompt):]
        if eos in gen:  # (rows are padded after an EOS)
            gen = gen[:gen.index(eos) + 1]
        seqs.append((gen, score))
    return seqs


def ours(llm, prompt, width, n, length_penalty=1.0, ignore_eos=False):
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=width, max_tokens=n, length_penalty=length_penalty,
                                                         ignore_eos=ignore_eos))
    return [(s.tokens[len(prompt):], s.score) for s in out.sequences]


def same(a, b):
    assert [t for t, _ in a] == [t for t, _ in b], (a, b)
    assert all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a, b)), (a, b)


@pytest.mark.parametrize("width", [2, 3, 4])
def test_beams_match_transformers(models, width):
    hf, llm = models
    for prompt in PROMPTS:
        # An EOS nobody reaches: every beam runs to max_tokens.
        same(ours(llm, prompt, width, 6, ignore_eos=True), hf_beams(hf, prompt, width, 6, eos=255))


def test_eos_ends_beams_as_transformers_does(models):
    """An EOS that some beams reach (one of the model's likely tokens made EOS) ends them early, with
    their shorter length in the score under each length penalty."""
    hf, llm = models
    prompt = PROMPTS[0]
    free = ours(llm, prompt, 4, 5, ignore_eos=True)
    eos = free[0][0][1]  # the token the best beam takes second

    for lp in (0.0, 1.0, 2.0):
        params = BeamSearchParams(beam_width=4, max_tokens=5, length_penalty=lp)
        gen = beam_search.search(prompt, params, {eos})
        want = next(gen)
        try:
            while True:
                want = gen.send(llm._expand(want, 4))
        except StopIteration as done:
            got = [(s.tokens[len(prompt):], s.score) for s in done.value]
        expected = hf_beams(hf, prompt, 4, 5, eos=eos, length_penalty=lp)
        same(got, expected)
        assert lp or any(g[-1] == eos and len(g) < 5 for g, _ in got)  # (summed scores favour the short)


def test_bad_params_are_value_errors():
    for kw in ({"beam_width": 0}, {"beam_width": 11}, {"max_tokens": 0}, {"temperature": 0.7}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **kw})
