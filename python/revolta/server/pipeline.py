"""The request pipeline the three APIs share (OpenAI chat and completions, Responses, Anthropic
Messages): model names, the chat prompt (templated and tokenized in a worker thread), sampling
parameters with the context checks, admission, and jobs that drive engine requests."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Awaitable, Callable, NamedTuple

from fastapi import Request
from fastapi.responses import JSONResponse

from revolta.config import ServerOptions
from revolta.guided import GuidedDecodingParams, ReasoningGate, from_request
from revolta.models.tokenizer import ChatTemplateError, Tokenizer
from revolta.sampling_params import SamplingParams
from revolta.multimodal.media_io import MediaPolicy
from revolta.server.async_engine import AsyncEngine
from revolta.server.errors import APIError
from revolta.server.job import Admission, Job, JobContext, admission_limits
from revolta.server.media import MediaRef, RequestMedia
from revolta.server.metrics import Metrics
from revolta.server.requests import ChatCompletionRequest, SamplingFields
from revolta.server.parsers.reasoning import ReasoningRouter, prompt_opens_reasoning, qwen3_reasoning_tokens
from revolta.server.parsers.tool_prompt import template_renders_tools, with_tools_section
from revolta.server.parsers.tool_grammar import calls_or_answer_grammar, tool_call_grammar
from revolta.server.parsers.tools import make_tool_parser

class RenderedChat(NamedTuple):
    text: str
    ids: list[int]
    tools: list[dict] | None
    thinking: bool
    media: list  # the engine's MediaInputs, in prompt order


# Template variables the server sets itself; chat_template_kwargs may not override them.
_RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})

log = logging.getLogger("revolta.server")


class Pipeline:
    def __init__(self, engine: AsyncEngine, tokenizer: Tokenizer, served_names: list[str], options: ServerOptions,
                 metrics: Metrics, sampling_defaults: dict | None = None, media: RequestMedia | None = None):
        self.engine = engine
        self.media = media or RequestMedia(None, MediaPolicy(), None, False)
        self.defaults = dict(sampling_defaults or {})  # the model's (generation_config), for fields a request leaves out
        self.tok = tokenizer
        self.served_names = served_names
        self.opts = options
        self.metrics = metrics
        self.max_model_len = engine.model_info.max_model_len
        # Every token decodes to at most max_token_chars characters, so a text longer than this
        # holds more than max_model_len tokens (x2: normalizers that drop characters).
        self.max_prompt_chars = 2 * self.max_model_len * tokenizer.max_token_chars
        self.reasoning_tokens = qwen3_reasoning_tokens(tokenizer) if options.reasoning_parser == "qwen3" else None
        # Templates that drop `tools`: the server describes them itself, in the call format.
        self.template_renders_tools = template_renders_tools(
            lambda m, t: tokenizer.apply_chat_template(m, add_generation_prompt=True, tools=t))
        self.tools_in_prompt = bool(options.tool_call_parser) and not self.template_renders_tools
        if self.tools_in_prompt:
            log.warning("the chat template does not render tools; the server adds them to the system prompt in the %s "
                        "format", options.tool_call_parser)
        info = engine.model_info
        kv_blocks = getattr(info, "kv_cache_tokens", 0) // getattr(engine, "block_size", 16)
        capacity, per_request = admission_limits(engine.max_num_seqs, kv_blocks, options.max_waiting_requests,
                                                 options.max_seqs_per_request)
        self.admission = Admission(capacity, per_request, metrics.reject)
        self.jobs = JobContext(engine, tokenizer, options, metrics, self.admission)
        self.scheduling_policy = getattr(engine, "scheduling_policy", "fair")
        log.info("admission: %d running (max_num_seqs) + %s waiting (max_waiting_requests%s), at most %s per request "
                 "(max_seqs_per_request); scheduling_policy %s", engine.max_num_seqs,
                 capacity - engine.max_num_seqs if capacity is not None else "unlimited",
                 "" if options.max_waiting_requests is not None else ", derived", per_request if per_request else "any",
                 self.scheduling_policy)

    def check_model(self, model: str | None) -> str:
        if model is None or model in self.served_names:
            return self.served_names[0]
        raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")

    async def run_job(self, raw: Request | None, slots: int, handler: Callable[[Job], Awaitable], priority: int = 0):
        """Runs handler with a new job (admitted for `slots` engine requests). The job ends when
        the handler fails or completes a non-streaming response; a stream ends it as it closes."""
        if priority and self.scheduling_policy != "priority":
            raise APIError(400, f"priority {priority} needs the server started with --scheduling-policy priority "
                                f"(it runs {self.scheduling_policy})", param="priority")
        job = Job(self.jobs, raw, slots, priority)
        try:
            return await handler(job)
        except BaseException:
            job.close()
            raise

    def context_error(self, prompt_len: int, param: str = "messages") -> APIError:
        return APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has "
                             f"{prompt_len} tokens, which leaves no room for the completion.", param=param)

    async def encode(self, text: str, add_special_tokens: bool, param: str) -> list[int]:
        """Tokenizes in a worker thread (a long text would stall every stream on the event loop)."""
        if len(text) > self.max_prompt_chars:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt has "
                                f"{len(text)} characters, more than that many tokens can hold.", param=param)
        return await asyncio.to_thread(self.tok.encode, text, add_special_tokens)

    def sampling(self, req: SamplingFields, prompt_len: int, max_tokens: int | None, logprobs: int | None,
                 prompt_logprobs: int | None = None) -> SamplingParams:
        if prompt_len >= self.max_model_len:
            raise self.context_error(prompt_len)
        room = self.max_model_len - prompt_len
        if max_tokens is not None and max_tokens > room:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the completion).",
                param="max_tokens",
            )
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        try:
            guided = from_request(req.response_format, req.guided_json, req.guided_regex, req.guided_choice,
                                  req.guided_grammar)
        except ValueError as e:
            raise APIError(400, str(e), param=str(e).split(":")[0].split(" ")[0]) from e
        d = self.defaults

        def pick(value, name, fallback):
            return value if value is not None else d.get(name, fallback)

        bias = req.logit_bias or {}
        vocab = self.engine.model_info.vocab_size
        if any(t >= vocab for t in bias):
            raise APIError(400, f"logit_bias: token id {max(bias)} is outside the vocabulary [0, {vocab})",
                           param="logit_bias")
        if max_tokens is None and d.get("max_tokens") is not None:
            max_tokens = min(int(d["max_tokens"]), room)
        try:
            return SamplingParams(
                guided_decoding=guided,
                n=req.n,
                temperature=pick(req.temperature, "temperature", 1.0),
                top_p=pick(req.top_p, "top_p", 1.0),
                top_k=pick(req.top_k, "top_k", 0),
                min_p=pick(req.min_p, "min_p", 0.0),
                presence_penalty=pick(req.presence_penalty, "presence_penalty", 0.0),
                frequency_penalty=pick(req.frequency_penalty, "frequency_penalty", 0.0),
                repetition_penalty=pick(req.repetition_penalty, "repetition_penalty", 1.0),
                seed=req.seed,
                max_tokens=max_tokens if max_tokens is not None else room,
                min_tokens=min(req.min_tokens, max_tokens or room),
                stop=stop,
                stop_token_ids=list(req.stop_token_ids or []),
                logit_bias=bias or None,
                include_stop_str_in_output=req.include_stop_str_in_output,
                ignore_eos=req.ignore_eos,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs if prompt_logprobs is not None else req.prompt_logprobs,
                skip_special_tokens=req.skip_special_tokens,
            )
        except ValueError as e:
            raise APIError(400, str(e)) from e

    def token_text(self, t: int) -> str:
        return self.tok.decode([t], skip_special_tokens=False)

    def prompt_logprobs(self, c) -> list | None:
        """vLLM's prompt_logprobs: None for the first prompt token, then {token_id: {logprob,
        decoded_token}} with the prompt token and its alternatives."""
        if c.prompt_tokens is None:
            return None
        return [None] + [{str(t): {"logprob": lp, "decoded_token": self.token_text(t)}
                          for t, lp in [*ti.top, (ti.token, ti.logprob)]} for ti in c.prompt_tokens]

    async def complete(self, job: Job, build) -> JSONResponse:
        """A non-streaming response: drives the job to its end, then builds the body."""
        try:
            await job.run()
            return JSONResponse(build())
        finally:
            job.close()

    def conversation(self, req: ChatCompletionRequest, refs: list[MediaRef] | None = None) -> list[dict]:
        """The request's messages as the template reads them: text parts joined (a message with
        media keeps its parts, each image as {"type": "image"}, its media noted in refs), tool-call
        arguments parsed, system text without Claude Code's billing line."""
        messages = []
        refs = [] if refs is None else refs
        for i, m in enumerate(req.messages):
            d = m.model_dump(exclude_none=True)
            d.setdefault("content", "")  # an assistant tool-call turn's content: null (templates read .content)
            system = d["role"] in ("system", "developer")
            if isinstance(d.get("content"), list):
                parts = d["content"]
                if any(p.get("type") != "text" for p in parts):
                    d["content"] = [{"type": "text", "text": p.get("text") or ""} if p.get("type") == "text"
                                    else self.media.template_part(p, f"messages[{i}].content[{j}]", refs)
                                    for j, p in enumerate(parts)]
                    messages.append(d)
                    continue
                texts = [p.get("text") or "" for p in parts]
                d["content"] = "".join(without_billing_header(t) if system else t for t in texts)
            elif system and isinstance(d.get("content"), str):
                d["content"] = without_billing_header(d["content"])
            for call in d.get("tool_calls") or []:
                fn = call["function"]
                if isinstance(fn["arguments"], str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
            messages.append(d)
        return messages

    def render_chat_text(self, req: ChatCompletionRequest,
                         refs: list[MediaRef] | None = None) -> tuple[str, list[dict] | None, bool]:
        tool_choice = req.tool_choice
        if not (tool_choice in (None, "none", "auto", "required") or forced_name(tool_choice)):
            raise APIError(400, f"tool_choice {json.dumps(tool_choice)} is not supported; use 'auto', 'none', 'required' "
                                "or {\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        use_tools = bool(tools) and tool_choice != "none"
        fmt = self.tool_format(tool_choice)
        if use_tools and not fmt:
            raise APIError(400, "tool_choice 'auto' needs a tool-call parser to find the model's calls: start the server "
                                "with --tool-call-parser (hermes or qwen3_coder); tool_choice 'required' or a named "
                                "function works without one", param="tool_choice")
        messages = self.conversation(req, refs)
        kwargs = dict(req.chat_template_kwargs or {})
        reserved = sorted(_RESERVED_TEMPLATE_VARS & set(kwargs))
        if reserved:
            raise APIError(400, f"chat_template_kwargs may not set {', '.join(reserved)} (the server sets them)", param="chat_template_kwargs")
        if use_tools and not self.template_renders_tools:
            messages = with_tools_section(messages, fmt, tools)
        try:
            text = self.tok.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt, tools=tools if use_tools else None, **kwargs)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from e
        thinking = bool(kwargs.get("enable_thinking", True))
        return text, tools if use_tools else None, thinking

    async def render_chat(self, req: ChatCompletionRequest) -> RenderedChat:
        """The prompt text and ids, the tools in use, whether thinking is on and the prompt's media;
        templating, tokenizing and media processing run in worker threads."""
        refs: list[MediaRef] = []
        text, tools, thinking = await asyncio.to_thread(self.render_chat_text, req, refs)
        ids = await self.encode(text, False, "messages")
        media: list = []
        if refs or req.mm_processor_kwargs:
            ids, media = await asyncio.to_thread(self.media.expand, ids, refs, req.mm_processor_kwargs)
        return RenderedChat(text, ids, tools, thinking, media)

    def parsers(self, prompt_ids: list[int], tools: list[dict] | None, thinking: bool,
                tool_choice=None) -> tuple[Callable, Callable]:
        """Factories of each choice's reasoning router and tool parser (or of None)."""
        rt = self.reasoning_tokens
        router = (lambda: ReasoningRouter(rt, prompt_opens_reasoning(prompt_ids, rt), enabled=thinking)) if rt else (lambda: None)
        fmt = self.tool_format(tool_choice)
        tool = (lambda: make_tool_parser(fmt, tools)) if tools else (lambda: None)
        return router, tool

    def grammar_after_reasoning(self, params: SamplingParams, prompt_ids: list[int], thinking: bool) -> None:
        """With thinking on, a request's grammar (a forced call, response_format, guided_*) holds the
        answer only: the reasoning before it is the model's own."""
        rt = self.reasoning_tokens
        if params.guided_decoding is None or not thinking or rt is None:
            return
        params.guided_after = ReasoningGate(start=rt.start, end=rt.end, answer=rt.tool_call,
                                            in_reasoning=prompt_opens_reasoning(prompt_ids, rt))

    def tool_format(self, tool_choice) -> str | None:
        """The format of the model's tool calls: the server's parser, or where a call is forced (its
        grammar holds the output to a format, so none needs recognising) hermes's."""
        if self.opts.tool_call_parser:
            return self.opts.tool_call_parser
        return FORCED_CALL_FORMAT if tool_choice == "required" or forced_name(tool_choice) else None

    def force_tool_calls(self, tool_choice, parallel: bool, tools: list[dict] | None, params: SamplingParams) -> None:
        """tool_choice "required" or a named function: the output held to calls of the tools' schemas."""
        name = forced_name(tool_choice)
        if tool_choice != "required" and name is None:
            return
        if not tools:
            raise APIError(400, "tool_choice forces a tool call but the request has no tools", param="tool_choice")
        if params.guided_decoding is not None:
            raise APIError(400, f"tool_choice and {params.guided_decoding.field_name} exclude each other", param="tool_choice")
        try:
            grammar = tool_call_grammar(self.tool_format(tool_choice), tools, name, parallel)
        except ValueError as e:
            raise APIError(400, str(e), param="tool_choice") from e
        params.guided_decoding = GuidedDecodingParams(grammar=grammar, field_name="tool_choice")

    def calls_or_answer(self, tool_choice, parallel: bool, tools: list[dict] | None, params: SamplingParams) -> None:
        """tool_choice "auto" with tools beside a JSON answer format: the grammar allows either calls
        (in the parser's format) or the answer, not the answer alone (which would rule out calls)."""
        guided = params.guided_decoding
        if not tools or guided is None or tool_choice not in (None, "auto") or not self.opts.tool_call_parser:
            return
        try:
            kind, data = guided.engine_form()
        except ValueError as e:
            raise APIError(400, str(e), param=guided.field_name) from e
        if kind != "json":  # (a regex, choice or grammar answer keeps its own grammar)
            return
        grammar = calls_or_answer_grammar(self.opts.tool_call_parser, tools, parallel, data)
        params.guided_decoding = GuidedDecodingParams(grammar=grammar, field_name=guided.field_name)

    async def decode(self, ids: list[int], param: str = "prompt") -> str:
        bad = [t for t in ids if t >= max(self.engine.model_info.vocab_size, self.tok.vocab_size)]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary", param=param)
        return await asyncio.to_thread(self.tok.decode, ids, False)


FORCED_CALL_FORMAT = "hermes"  # a forced call's format on a server started without --tool-call-parser
BILLING_HEADER = "x-anthropic-billing-header:"


def without_billing_header(text: str) -> str:
    """A system text without Claude Code's leading `x-anthropic-billing-header: ...` line, whose
    value changes every request: left in, it would end every prompt's cached prefix at its start."""
    if not text.lstrip().startswith(BILLING_HEADER):
        return text
    _, _, rest = text.lstrip().partition("\n")
    return rest


def forced_name(tool_choice) -> str | None:
    """The function a tool_choice object names ({"type": "function", "function": {"name": ...}}), else None."""
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
    return None
