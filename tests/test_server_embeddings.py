"""/v1/embeddings (through the official openai SDK), vLLM's /pooling, /score and /rerank on the real
server, against transformers: a tiny random Qwen3 with sentence-transformers' mean pooling and
normalisation gives the base model's mean last_hidden_state, normalised, within 1e-4; scores are
the cosine similarities of those vectors. Pooling requests hold their admission slots only while
they run, and bad input is a 400 naming the field."""

from __future__ import annotations

import base64
import struct
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch

from conftest import make_hf_model
from server_fixture import ServerProcess
from test_embeddings import hf_embedding, write_pooling

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from qwen4exp_reference import write_tokenizer  # noqa: E402

TEXTS = ["the sea is wide", "a cat sat on the mat", "stocks fell in the morning"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("embedder")
    hf = make_hf_model("qwen3", path, seed=5, vocab_size=300, max_position_embeddings=512)
    write_tokenizer(path, 300)
    write_pooling(path, "mean")
    # Room for four engine requests running and four waiting: leaked admission slots show soon.
    srv = ServerProcess("--model", str(path), "--served-model-name", "emb", "--max-model-len", "256",
                        "--max-num-seqs", "4", "--max-waiting-requests", "4", "--kv-cache-memory-bytes", str(16 << 20))
    yield hf, srv
    log = srv.stop()
    assert "Traceback" not in log, log


def hf_vector(srv, hf, text):
    ids = httpx.post(srv.url + "/tokenize", json={"prompt": text}).json()["tokens"]
    return hf_embedding(hf, ids, "mean")


def test_embeddings_match_transformers(setup):
    hf, srv = setup
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    r = client.embeddings.create(model="emb", input=TEXTS)
    assert [d.index for d in r.data] == [0, 1, 2] and r.usage.prompt_tokens > 0
    refs = [hf_vector(srv, hf, t) for t in TEXTS]
    for d, ref in zip(r.data, refs):
        assert torch.allclose(torch.tensor(d.embedding), ref, atol=1e-4)
    packed = client.embeddings.create(model="emb", input=TEXTS[0], encoding_format="base64").data[0].embedding
    floats = struct.unpack(f"<{len(refs[0])}f", base64.b64decode(packed)) if isinstance(packed, str) else packed
    assert torch.allclose(torch.tensor(floats), refs[0], atol=1e-4)
    pooled = httpx.post(srv.url + "/pooling", json={"model": "emb", "input": TEXTS[1]}).json()["data"][0]
    assert pooled["object"] == "pooling" and torch.allclose(torch.tensor(pooled["data"]), refs[1], atol=1e-4)


def test_score_and_rerank_are_cosines(setup):
    hf, srv = setup
    refs = [hf_vector(srv, hf, t) for t in TEXTS]
    cos = [float(torch.nn.functional.cosine_similarity(refs[0], v, dim=0)) for v in refs]
    r = httpx.post(srv.url + "/score", json={"model": "emb", "text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
    assert [round(d["score"], 4) for d in r["data"]] == [round(c, 4) for c in cos[1:]]
    r = httpx.post(srv.url + "/v1/rerank", json={"model": "emb", "query": TEXTS[0], "documents": TEXTS[1:] + TEXTS[:1],
                                                 "top_n": 2}).json()
    ranked = sorted(range(3), key=lambda i: -[cos[1], cos[2], cos[0]][i])[:2]
    assert [x["index"] for x in r["results"]] == ranked and r["results"][0]["document"]["text"] == TEXTS[0]


def test_slots_are_released_and_bad_input_is_400(setup):
    _, srv = setup
    for _ in range(6):  # more than the queue holds, one after another
        r = httpx.post(srv.url + "/v1/embeddings", json={"model": "emb", "input": TEXTS})
        assert r.status_code == 200, r.text
    for _ in range(5):  # beam search's engine requests too
        r = httpx.post(srv.url + "/v1/completions", json={"model": "emb", "prompt": "the sea", "max_tokens": 3, "n": 2,
                                                          "use_beam_search": True})
        assert r.status_code == 200, r.text
    for path, body, param in (("/v1/embeddings", {"input": []}, "input"),
                              ("/v1/embeddings", {"input": [[]]}, "input"),
                              ("/v1/embeddings", {"input": [5, 400]}, "input"),
                              ("/v1/embeddings", {"input": "x" * 20000}, "input"),
                              ("/v1/embeddings", {"input": "x", "dimensions": 3}, "dimensions"),
                              ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
                              ("/v1/embeddings", {"input": ["a"] * 5}, "n"),
                              ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1"),
                              ("/rerank", {"query": "a", "documents": []}, "documents"),
                              ("/rerank", {"query": "a", "documents": ["b"], "top_n": 0}, "top_n")):
        r = httpx.post(srv.url + path, json={"model": "emb", **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, body, r.text)
    assert httpx.post(srv.url + "/v1/embeddings", json={"model": "nope", "input": "a"}).status_code == 404
