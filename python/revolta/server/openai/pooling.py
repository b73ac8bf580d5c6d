"""Embedding endpoints: OpenAI's /v1/embeddings, vLLM's /pooling, /score and /rerank. Each input is
one pooling request to the same engine the chat endpoints use (revolta/pooling.py: the model's
last-token or mean pooling, normalised as its config says); /score and /rerank rank by the cosine
similarity of the embeddings (vLLM's scoring for embedding models)."""

from __future__ import annotations

import base64
import struct
import time
import uuid
from typing import Literal

from fastapi import Request
from pydantic import Field

from revolta import pooling
from revolta.server.errors import APIError
from revolta.server.job import Job
from revolta.server.pipeline import Pipeline
from revolta.server.schema import Priority, RequestModel, TokenId

Inputs = str | list[str] | list[TokenId] | list[list[TokenId]]
MAX_INPUTS = 2048  # OpenAI's limit on one embeddings request's inputs


class EmbeddingRequest(RequestModel):
    model: str | None = None
    input: Inputs
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None  # (an end-user id: it changes no result)
    priority: Priority = 0


class ScoreRequest(RequestModel):
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    priority: Priority = 0


class RerankRequest(RequestModel):
    model: str | None = None
    query: str
    documents: list[str] = Field(min_length=1, max_length=MAX_INPUTS)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True
    priority: Priority = 0


class PoolingServing:
    def __init__(self, pipeline: Pipeline, model_dir: str | None):
        self.p = pipeline
        self.model_dir = model_dir
        self._config: pooling.PoolingConfig | None = None

    def config(self) -> pooling.PoolingConfig:
        if self._config is None:
            try:
                self._config = pooling.pooling_config(self.model_dir) if self.model_dir else pooling.PoolingConfig()
            except ValueError as e:
                raise APIError(400, f"this model cannot embed: {e}", param="model") from e
        return self._config

    # ---- endpoints ----------------------------------------------------------------------------

    async def embeddings(self, req: EmbeddingRequest, raw: Request | None, vllm_pooling: bool = False) -> dict:
        model = self.p.check_model(req.model)
        size = getattr(self.p.engine.model_info, "hidden_size", None)
        if req.dimensions is not None and req.dimensions != size:
            raise APIError(400, f"dimensions {req.dimensions}: this model's embeddings have {size} "
                                "(it is not trained to be truncated)", param="dimensions")
        texts = await self.inputs(req.input, "input")
        vectors = await self.run(raw, texts, req.priority)
        kind = "pooling" if vllm_pooling else "embedding"
        data = [{"index": i, "object": kind, ("data" if vllm_pooling else "embedding"): encode(v, req.encoding_format)}
                for i, v in enumerate(vectors)]
        tokens = sum(len(t) for t in texts)
        return {"id": f"{'pool' if vllm_pooling else 'embd'}-{uuid.uuid4().hex}", "object": "list",
                "created": int(time.time()), "model": model, "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def score(self, req: ScoreRequest, raw: Request | None) -> dict:
        model = self.p.check_model(req.model)
        a = [req.text_1] if isinstance(req.text_1, str) else list(req.text_1)
        b = [req.text_2] if isinstance(req.text_2, str) else list(req.text_2)
        if not a or not b:
            raise APIError(400, "text_1 and text_2 must not be empty", param="text_1" if not a else "text_2")
        if len(a) == 1:
            a = a * len(b)
        if len(a) != len(b):
            raise APIError(400, f"text_1 has {len(a)} texts and text_2 {len(b)}: give one text_1 or as many as text_2",
                           param="text_1")
        ids = await self.inputs(a + b, "text_1")
        vectors = await self.run(raw, ids, req.priority)
        n = len(a)
        data = [{"index": i, "object": "score", "score": pooling.cosine(vectors[i], vectors[n + i])} for i in range(n)]
        tokens = sum(len(t) for t in ids)
        return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model,
                "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    async def rerank(self, req: RerankRequest, raw: Request | None) -> dict:
        model = self.p.check_model(req.model)
        ids = await self.inputs([req.query] + req.documents, "documents")
        vectors = await self.run(raw, ids, req.priority)
        scores = [pooling.cosine(vectors[0], v) for v in vectors[1:]]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n or len(scores)]
        results = [{"index": i, "relevance_score": scores[i], **({"document": {"text": req.documents[i]}} if req.return_documents else {})}
                   for i in order]
        tokens = sum(len(t) for t in ids)
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": model, "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    # ---- shared -------------------------------------------------------------------------------

    async def inputs(self, value, param: str) -> list[list[int]]:
        """Token ids of each input (text is tokenized as the completions endpoint does)."""
        if isinstance(value, str):
            items = [value]
        elif value and all(isinstance(x, int) for x in value):
            items = [value]
        else:
            items = list(value)
        if not items:
            raise APIError(400, f"{param} must not be empty", param=param)
        if len(items) > MAX_INPUTS:
            raise APIError(400, f"{param} has {len(items)} inputs; at most {MAX_INPUTS}", param=param)
        out = []
        vocab = self.p.engine.model_info.vocab_size
        for item in items:
            ids = await self.p.encode(item, True, param) if isinstance(item, str) else list(item)
            if not ids:
                raise APIError(400, f"{param}: an input has no tokens", param=param)
            if len(ids) >= self.p.max_model_len:
                raise APIError(400, f"{param}: an input has {len(ids)} tokens; this model's maximum context length is "
                                    f"{self.p.max_model_len}", param=param)
            if any(t >= vocab for t in ids):
                raise APIError(400, f"{param}: token id {max(ids)} is outside the vocabulary", param=param)
            out.append(ids)
        return out

    async def run(self, raw: Request | None, prompts: list[list[int]], priority: int) -> list[list[float]]:
        """Each prompt's embedding, from pooling requests admitted as one job."""
        cfg = self.config()

        async def handler(job: Job) -> list[list[float]]:
            added = []
            try:
                for ids in prompts:
                    added.append(self.p.engine.add_request(ids, pooling.pooling_params(cfg), job.tag))
                    job.prompt_len += len(ids)
                vectors = []
                for rid, q in added:
                    out = await q.get()
                    if not getattr(out, "finished", False) or getattr(out, "finish_reason", "") == "error":
                        message = getattr(out, "message", None) or getattr(out, "error", "") or "no embedding"
                        raise APIError(getattr(out, "status", 500), f"the engine failed: {message}")
                    vectors.append(pooling.finish(list(out.embedding), cfg.normalize))
                    added = [(r, qq) for r, qq in added if r != rid]
                return vectors
            except ValueError as e:
                raise APIError(400, str(e)) from e
            finally:
                for rid, _ in added:
                    self.p.engine.abort(rid)
                job.close()

        return await self.p.run_job(raw, len(prompts), handler, priority)


def encode(vector: list[float], fmt: str):
    """float: the list; base64: little-endian float32 bytes, as OpenAI's API sends them."""
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
