"""The FastAPI application: routes, error mapping, metrics, health; wrapped in the request guard
(API key, body limits) and, when origins are allowed, CORS."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.staticfiles import StaticFiles

import revolta
from revolta.config import ServerOptions
from revolta.models.tokenizer import Tokenizer
from revolta.multimodal.media_io import MediaPolicy
from revolta.multimodal.prompt import MultimodalProcessor
from revolta.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from revolta.server.anthropic.serving import AnthropicServing
from revolta.server.async_engine import AsyncEngine
from revolta.server.errors import APIError, body_location, error_message, error_response, json_error, telling_error
from revolta.server.guard import RequestGuard
from revolta.server.job import ClientGone
from revolta.server.media import RequestMedia
from revolta.server.metrics import Metrics
from revolta.server.openai.protocol import CompletionRequest, DetokenizeRequest, ResponsesRequest, TokenizeRequest
from revolta.server.requests import ChatCompletionRequest
from revolta.server.openai.pooling import EmbeddingRequest, PoolingServing, RerankRequest, ScoreRequest
from revolta.server.openai.responses import ResponsesServing
from revolta.server.openai.serving import OpenAIServing
from revolta.server.pipeline import Pipeline
from revolta.server.schema import check_texts

log = logging.getLogger("revolta.server")


def json_safe(value):
    """value with its non-finite floats as text (a request's extra fields and parsed tool arguments
    may hold them; JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


class CheckedRoute(APIRoute):
    """Routes whose JSON body is checked for text no tokenizer can encode before the models see it
    (the parsed body is cached on the request, so it is parsed once)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if request.method == "POST" and await request.body():
                try:
                    body = await request.json()
                except Exception:  # noqa: BLE001 - FastAPI reports malformed JSON itself
                    body = None
                check_texts(body)
            try:
                return await handler(request)
            except (APIError, ClientGone, RequestValidationError, StarletteHTTPException):
                raise
            except Exception as e:  # noqa: BLE001
                # Answered here: past this point Starlette would re-raise it and the server would
                # drop the keep-alive connection.
                log.exception("internal error")
                return json_error(request.url.path, 500, f"internal error ({type(e).__name__}); see the server log")

        return checked


def create_app(engine: AsyncEngine, tokenizer: Tokenizer, served_names: list[str], options: ServerOptions,
               sampling_defaults: dict | None = None, server_info: dict | None = None, model_dir: str | None = None):
    """model_dir: where the model's pooling config may be (sentence-transformers' modules.json)."""
    app = FastAPI(title="ReVolta", version=revolta.__version__)
    app.router.route_class = CheckedRoute
    metrics = Metrics(engine)
    policy = MediaPolicy(options.allowed_media_domains, options.allowed_local_media_path, options.media_fetch_timeout_s,
                         options.max_media_bytes)
    takes_media = getattr(getattr(engine, "model_info", None), "takes_media", False)  # a vision tower is loaded
    processor = MultimodalProcessor.for_model(model_dir, lambda t: tokenizer.encode(t, False)) if model_dir and takes_media else None
    media = RequestMedia(processor, policy, options.limit_mm_per_prompt, options.trust_request_mm_kwargs)
    pipeline = Pipeline(engine, tokenizer, served_names, options, metrics, sampling_defaults, media)
    openai = OpenAIServing(pipeline)
    anthropic = AnthropicServing(pipeline)
    responses = ResponsesServing(pipeline)
    embedding = PoolingServing(pipeline, model_dir)
    app.state.engine, app.state.pipeline = engine, pipeline
    created = int(time.time())

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        if e.status >= 500:
            log.error("%s", e.message)
        else:
            log.info("rejected request: %s", e.message)
        return error_response(e, request.url.path)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, e: ClientGone):
        log.info("client of %s disconnected; its request was aborted", request.url.path)
        return json_error(request.url.path, 499, "client disconnected")  # nobody reads it

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":  # loc: ("body", offset)
            msg = f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'decode error')} at " \
                  f"character {first.get('loc', (None, '?'))[-1]})"
            log.info("rejected request: %s", msg)
            return json_error(request.url.path, 400, msg)
        first = telling_error(e.errors())
        param = ".".join(str(x) for x in body_location(first)) or None
        msg = f"{param}: {error_message(first)}" if param else error_message(first)
        log.info("rejected request: %s", msg)
        return json_error(request.url.path, 400, msg, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        return json_error(request.url.path, e.status_code, str(e.detail))

    @app.get("/health")
    async def health():
        if engine.dead:
            return JSONResponse({"status": "dead", "error": engine.dead}, status_code=503)
        if engine.stalled:
            return JSONResponse({"status": "stalled", "error": engine.stalled}, status_code=503)
        return {"status": "ok"}

    if options.dev_mode:
        add_dev_routes(app, engine, server_info or {})

    static = Path(__file__).parent / "static"

    @app.get("/", include_in_schema=False)
    async def playground():  # the chat playground (static files, no build step)
        return FileResponse(static / "index.html")

    app.mount("/static", StaticFiles(directory=static), name="static")

    @app.get("/version")
    async def version():
        return {"version": revolta.__version__}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        info = engine.model_info
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "revolta", "root": served_names[0], "max_model_len": info.max_model_len}
            for name in served_names
        ]}

    def check_alive() -> None:
        if engine.dead:
            raise APIError(503, f"the engine has failed: {engine.dead}")

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, raw: Request):
        check_alive()
        return await openai.chat(req, raw)

    @app.post("/v1/chat/completions/render")
    async def render_chat(req: ChatCompletionRequest):
        """vLLM's render: the conversation as templated and the engine prompt, without generating."""
        pipeline.check_model(req.model)
        text, ids, _, _, _ = await pipeline.render_chat(req)
        return JSONResponse(json_safe([pipeline.conversation(req), [{"prompt": text, "prompt_token_ids": ids}]]))

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request):
        check_alive()
        return await openai.completions(req, raw)

    @app.post("/v1/responses")
    async def create_response(req: ResponsesRequest, raw: Request):
        check_alive()
        return await responses.create(req, raw)

    @app.post("/v1/messages")
    async def messages(req: MessagesRequest, raw: Request):
        check_alive()
        return await anthropic.messages(req, raw)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(req: CountTokensRequest):
        return await anthropic.count_tokens(req)

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, raw: Request):
        check_alive()
        return await embedding.embeddings(req, raw)

    @app.post("/pooling")
    async def pool(req: EmbeddingRequest, raw: Request):
        """vLLM's: the pooled hidden states (the same vectors as /v1/embeddings)."""
        check_alive()
        return await embedding.embeddings(req, raw, vllm_pooling=True)

    @app.post("/score")
    @app.post("/v1/score")
    async def score(req: ScoreRequest, raw: Request):
        check_alive()
        return await embedding.score(req, raw)

    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    async def rerank(req: RerankRequest, raw: Request):
        check_alive()
        return await embedding.rerank(req, raw)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        pipeline.check_model(req.model)
        if req.messages is not None:  # rendered as the chat endpoint renders them
            if not req.messages:
                raise APIError(400, "messages is empty", param="messages")
            chat = ChatCompletionRequest(messages=req.messages, add_generation_prompt=req.add_generation_prompt)
            ids = (await pipeline.render_chat(chat)).ids
        elif req.prompt is not None:
            ids = await pipeline.encode(req.prompt, req.add_special_tokens, "prompt")
        else:
            raise APIError(400, "give 'prompt' or 'messages'", param="prompt")
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.model_info.max_model_len}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        pipeline.check_model(req.model)
        return {"prompt": await pipeline.decode(req.tokens, "tokens")}

    app.add_middleware(RequestGuard, options=options, on_reject=metrics.reject)
    if options.allowed_origins:
        # Added last, so outermost: preflight requests are answered without an API key.
        app.add_middleware(CORSMiddleware, allow_origins=options.allowed_origins, allow_methods=options.allowed_methods,
                           allow_headers=options.allowed_headers, allow_credentials=options.allow_credentials)
    return app


def add_dev_routes(app: FastAPI, engine: AsyncEngine, server_info: dict) -> None:
    """--dev-mode: vLLM's development endpoints. /sleep?level=1 frees the KV cache (and CUDA graphs),
    level=2 the weights too (Engine::sleep); running requests are recomputed after /wake_up, and
    requests that arrive meanwhile are accepted and wait."""
    core = engine.engine

    @app.post("/sleep")
    async def sleep(level: int = 1):
        if level not in (1, 2):
            raise APIError(400, f"level must be 1 (the KV cache) or 2 (the weights too), got {level}", param="level")
        await asyncio.to_thread(core.sleep, level)
        return {"is_sleeping": True, "level": core.sleep_level}

    @app.post("/wake_up")
    async def wake_up():
        await asyncio.to_thread(core.wake_up)
        return {"is_sleeping": False}

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": core.sleep_level > 0}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache():
        core.reset_prefix_cache()
        return {"status": "ok"}

    @app.get("/server_info")
    async def info():
        m, s = core.model_info, core.stats()
        model = {k: getattr(m, k) for k in ("architecture", "device", "max_model_len", "weight_dtype", "weight_bytes",
                                            "kv_cache_dtype", "kv_cache_bytes", "kv_cache_tokens", "tensor_parallel_size",
                                            "takes_media")}
        stats = {k: getattr(s, k) for k in ("num_running", "num_waiting", "num_steps", "num_blocks_used",
                                            "num_blocks_total", "prefix_cache_hits", "prefix_cache_queries")}
        return {"version": revolta.__version__, "model": model, "engine": {"activity": core.activity(),
                "is_sleeping": core.sleep_level > 0, "sleep_level": core.sleep_level, "paused": core.paused, "stalled": engine.stalled, **stats}, **server_info}
