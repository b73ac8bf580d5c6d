"""The FastAPI application: routes, auth, error mapping, metrics, health."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import revolta
from revolta.config import ServerOptions
from revolta.models.tokenizer import ChatTemplateError, Tokenizer
from revolta.server.async_engine import AsyncEngine
from revolta.server.anthropic.protocol import CountTokensRequest, MessagesRequest
from revolta.server.anthropic.serving import AnthropicServing
from revolta.server.errors import APIError, error_response, json_error
from revolta.server.metrics import Metrics
from revolta.server.openai.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ResponsesRequest, TokenizeRequest
from revolta.server.openai.responses import ResponsesServing
from revolta.server.openai.serving import OpenAIServing

log = logging.getLogger("revolta.server")


def create_app(engine: AsyncEngine, tokenizer: Tokenizer, served_names: list[str], options: ServerOptions) -> FastAPI:
    app = FastAPI(title="ReVolta", version=revolta.__version__)
    metrics = Metrics(engine)
    serving = OpenAIServing(engine, tokenizer, served_names, options, metrics)
    anthropic = AnthropicServing(serving)
    responses = ResponsesServing(serving)
    app.state.engine, app.state.serving = engine, serving
    generating = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}
    created = int(time.time())
    open_paths = {"/health", "/version", "/metrics"}

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if options.api_key and request.url.path not in open_paths:
            auth = request.headers.get("authorization", "")
            key = auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
            if key != options.api_key:
                return json_error(request.url.path, 401, "Invalid or missing API key.")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > options.max_request_bytes:
            return json_error(request.url.path, 413, f"request body of {length} bytes exceeds {options.max_request_bytes}")
        if request.method == "POST" and request.url.path in generating:
            if engine.dead:
                return json_error(request.url.path, 503, f"the engine has failed: {engine.dead}")
            if options.max_waiting_requests and engine.stats().num_waiting >= options.max_waiting_requests:
                return json_error(request.url.path, 429, f"too many requests waiting (limit {options.max_waiting_requests}); retry later")
        return await call_next(request)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        if e.status >= 500:
            log.error("%s", e.message)
        else:
            log.info("rejected request: %s", e.message)
        return error_response(e, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        param = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
        msg = f"{param}: {first.get('msg', 'invalid request')}" if param else str(first.get("msg", "invalid request"))
        log.info("rejected request: %s", msg)
        return json_error(request.url.path, 400, msg, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        return json_error(request.url.path, e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception):
        log.exception("internal error")
        return json_error(request.url.path, 500, f"internal error: {e}")

    @app.get("/health")
    async def health():
        if engine.dead:
            return JSONResponse({"status": "dead", "error": engine.dead}, status_code=503)
        return {"status": "ok"}

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

    @app.post("/v1/chat/completions")
    async def chat(req: ChatCompletionRequest, raw: Request):
        return await serving.chat(req, raw)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request):
        return await serving.completions(req, raw)

    @app.post("/v1/responses")
    async def create_response(req: ResponsesRequest):
        return await responses.create(req)

    @app.post("/v1/messages")
    async def messages(req: MessagesRequest):
        return await anthropic.messages(req)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(req: CountTokensRequest):
        return await anthropic.count_tokens(req)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest):
        serving.check_model(req.model)
        if req.messages is not None:
            try:
                text = tokenizer.apply_chat_template([m.model_dump(exclude_none=True) for m in req.messages], add_generation_prompt=req.add_generation_prompt)
            except ChatTemplateError as e:
                raise APIError(400, str(e), param="messages") from e
            ids = tokenizer.encode(text, add_special_tokens=False)
        elif req.prompt is not None:
            ids = tokenizer.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            raise APIError(400, "give 'prompt' or 'messages'", param="prompt")
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.model_info.max_model_len}

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest):
        serving.check_model(req.model)
        vocab = engine.model_info.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < max(vocab, tokenizer.vocab_size)]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary", param="tokens")
        return {"prompt": tokenizer.decode(req.tokens, skip_special_tokens=False)}

    return app
