"""Offline inference: LLM(model).generate(prompts, SamplingParams) and chat(messages)."""

from __future__ import annotations

import inspect
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from pydantic import ValidationError

from revolta import _core, beam_search, pooling
from revolta.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from revolta.config import EngineOptions, describe_errors
from revolta.kv_calibration import calibration_prompts as calibration_prompts_of
from revolta.engine_setup import engine_config
from revolta.models.resolve import resolve_model
from revolta.models.tokenizer import IncrementalDetokenizer, Tokenizer
from revolta.multimodal.prompt import MultimodalProcessor
from revolta.outputs import CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from revolta.generation_defaults import generation_defaults
from revolta.sampling_params import SamplingParams
from revolta.stop_strings import StopStrings

PromptType = str | Sequence[int] | dict[str, Any]


@dataclass
class _Sequence:
    """One engine request (one of the n completions of a prompt) as Python follows it."""

    params: SamplingParams
    detok: IncrementalDetokenizer | None
    index: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    logits: list[list[float]] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def __post_init__(self) -> None:
        self.stops = StopStrings(self.params.stop, self.params.include_stop_str_in_output)

    def apply(self, out: _core.RequestOutput) -> bool:
        """Takes an engine output; returns True when a stop string ended the sequence here."""
        for t in out.tokens:
            self.token_ids.append(t.token)
            if self.params.logprobs is not None:
                entry = {a.token: a.logprob for a in t.top_logprobs}
                entry[t.token] = t.logprob
                self.logprobs.append(entry)
                self.cumulative_logprob += t.logprob
            if self.params.return_generation_logits:
                self.logits.append(list(t.logits))
            if self.detok is not None:
                before = len(self.text)
                self.text += self.detok.add([t.token])
                found = self.stops.find(self.text, before)
                if found is not None:
                    self.text = self.text[: found[0]]
                    self.finish_reason, self.stop_reason = "stop", found[1]
                    return True
        if out.finished:
            self.finish_reason = out.finish_reason
            if out.finish_reason == "stop" and out.stop_token_id in self.params.stop_token_ids:
                self.stop_reason = out.stop_token_id  # (EOS: None, as vLLM reports it)
        return False


class LLM:
    """An engine plus its tokenizer, for batch generation from Python.

    model: an HF directory (config.json + safetensors), a .gguf file, or None for the embedded
    demo model. The remaining options are the engine's, as docs/options.md lists them.
    """

    def __init__(self, model: str | None = None, *, calibration_prompts: list[list[int]] | None = None, **options: Any):
        """options: any engine option by name (EngineOptions: the engine's option table and the
        Python layer's, as the server's flags have them). calibration_prompts: token ids for
        calculate_kv_scales (default: a few built-in prompts through the tokenizer)."""
        try:
            e = EngineOptions(model=model, **options)
        except ValidationError as err:
            raise ValueError(describe_errors(err)) from None
        self.model_path = resolve_model(e.model, e.load_format, e.device, e.revision, e.download_dir)
        self.default_sampling = generation_defaults(self.model_path, e.generation_config, e.override_generation_config)
        self.scheduling_policy = e.scheduling_policy
        cfg = engine_config(e, self.model_path)
        tok_dir = e.tokenizer or self.model_path
        try:
            self.tokenizer: Tokenizer | None = Tokenizer(tok_dir)
        except FileNotFoundError:
            self.tokenizer = None
        if e.calculate_kv_scales:
            if calibration_prompts is None and self.tokenizer is None:
                raise ValueError(f"calculate_kv_scales: no tokenizer.json in {tok_dir} to make the calibration "
                                 "prompts of; pass calibration_prompts (token ids)")
            cfg.calibration_prompts = calibration_prompts or calibration_prompts_of(self.tokenizer)
        self.engine = _core.Engine(cfg)
        self.model_info = self.engine.model_info
        encode_text = (lambda text: self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer else None
        self.multimodal = MultimodalProcessor.for_model(self.model_path, encode_text) if self.model_info.takes_media else None
        for warning in self.model_info.warnings:
            logging.getLogger("revolta").warning("%s", warning)
        self._ids = itertools.count()

    # ---- public API -----------------------------------------------------------------------

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's defaults (generation_config), which generate and chat
        use when given none."""
        return SamplingParams(**self.default_sampling)

    def get_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"no tokenizer.json in {self.model_path}; pass token ids instead of text")
        return self.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """priority (vLLM's): one per prompt, lower first; needs scheduling_policy "priority"."""
        prompt_list = self._normalize_prompts(prompts)
        if priority is not None:
            priority = list(priority)
            if len(priority) != len(prompt_list):
                raise ValueError(f"got {len(priority)} priorities for {len(prompt_list)} prompts")
            if any(priority) and self.scheduling_policy != "priority":
                raise ValueError("priority needs LLM(..., scheduling_policy='priority')")
        if sampling_params is None:
            params_list = [self.get_default_sampling_params()] * len(prompt_list)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"got {len(params_list)} sampling_params for {len(prompt_list)} prompts")
        encoded = [self._encode_media(p) for p in prompt_list]
        return self._run(encoded, params_list, priority)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tok = self.get_tokenizer()
        prompts = []
        for conv in conversations:
            text = tok.apply_chat_template(conv, add_generation_prompt=True, tools=tools, **(chat_template_kwargs or {}))
            prompts.append({"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params)

    def embed(self, prompts: PromptType | Sequence[PromptType], normalize: bool | None = None) -> list[EmbeddingRequestOutput]:
        """vLLM's LLM.embed: each prompt's final hidden states pooled as the model's config says
        (revolta/pooling.py: last token or mean), normalised unless normalize=False says otherwise."""
        cfg = self.pooling_config()
        encoded = [ids for _, ids in (self._encode(p) for p in self._normalize_prompts(prompts))]
        outs = self._final_outputs(encoded, pooling.pooling_params(cfg))
        keep_norm = cfg.normalize if normalize is None else normalize
        return [EmbeddingRequestOutput(request_id=str(o.request_id), prompt_token_ids=p,
                                       outputs=EmbeddingOutput(pooling.finish(list(o.embedding), keep_norm)))
                for o, p in zip(outs, encoded)]

    def score(self, text_1: str | list[str], text_2: str | list[str]) -> list[float]:
        """vLLM's LLM.score for an embedding model: the cosine similarity of each pair (one text_1
        against every text_2, or pairwise)."""
        a = [text_1] if isinstance(text_1, str) else list(text_1)
        b = [text_2] if isinstance(text_2, str) else list(text_2)
        if len(a) == 1:
            a = a * len(b)
        if len(a) != len(b):
            raise ValueError(f"text_1 has {len(a)} texts and text_2 {len(b)}: give one text_1 or as many as text_2")
        vectors = [o.outputs.embedding for o in self.embed(a + b)]
        return [pooling.cosine(x, y) for x, y in zip(vectors[:len(a)], vectors[len(a):])]

    def pooling_config(self) -> pooling.PoolingConfig:
        if not hasattr(self, "_pooling"):
            self._pooling = pooling.pooling_config(self.model_path)
        return self._pooling

    def beam_search(self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: each prompt's beam_width best sequences (revolta/beam_search.py),
        every prompt's beams expanded in the same engine steps."""
        encoded = [self._encode(p) for p in self._normalize_prompts(prompts)]
        eos = set(self.model_info.eos_token_ids)
        room = max(len(ids) for _, ids in encoded) + params.max_tokens
        if room > self.model_info.max_model_len:
            raise ValueError(f"max_tokens {params.max_tokens} leaves no room in max_model_len {self.model_info.max_model_len}")
        steps = beam_search.Lockstep([ids for _, ids in encoded], params, eos)
        while not steps.done:
            steps.feed(self._expand(steps.pending(), params.beam_width))
        results = steps.results
        out = []
        for seqs in results:
            for s in seqs:
                if self.tokenizer is not None:
                    s.text = self.tokenizer.decode(s.tokens, skip_special_tokens=True)
            out.append(BeamSearchOutput(sequences=seqs))
        return out

    def _expand(self, sequences: list[list[int]], width: int) -> list[list[tuple[int, float]]]:
        """Each sequence's 2 x width best next tokens, in one batch of engine requests."""
        return [beam_search.top_alternatives(o.tokens) for o in self._final_outputs(sequences, beam_search.step_params(width))]

    def _final_outputs(self, prompts: list[list[int]], params: _core.SamplingParams) -> list[_core.RequestOutput]:
        """The last output of each of one-output requests (an embedding, one token), in order; a
        failed request raises RuntimeError, and every request is aborted if this is left early."""
        ids = self.engine.add_requests(prompts, [params] * len(prompts), [_core.SchedulingTag()] * len(prompts))
        got: dict[int, _core.RequestOutput] = {}
        try:
            while len(got) < len(ids):
                for out in self.engine.await_outputs(0.05):
                    if out.finished:
                        if out.finish_reason == "error":
                            raise RuntimeError(out.error)
                        got[out.request_id] = out
        except BaseException:
            for rid in ids:
                self.engine.abort(rid)
            raise
        return [got[rid] for rid in ids]

    def stats(self) -> _core.EngineStats:
        return self.engine.stats()

    def sleep(self, level: int = 1) -> None:
        """Frees memory until wake_up (vLLM's sleep mode): level 1 the KV cache and CUDA graphs,
        level 2 the weights too (read from the model files again on wake_up)."""
        self.engine.sleep(level)

    def wake_up(self) -> None:
        self.engine.wake_up()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- internals ------------------------------------------------------------------------

    @staticmethod
    def _normalize_prompts(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        prompts = list(prompts)
        if prompts and all(isinstance(x, int) for x in prompts):
            return [prompts]  # one tokenized prompt
        return prompts

    def _encode(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.get_tokenizer().encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            if "prompt" in prompt:
                return prompt["prompt"], self.get_tokenizer().encode(prompt["prompt"])
            raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        ids = list(prompt)
        if not all(isinstance(t, int) for t in ids):
            raise ValueError("a token-id prompt must be a list of ints")
        return None, ids

    def _encode_media(self, prompt: PromptType) -> tuple[str | None, list[int], list]:
        """_encode, and for a prompt dict with multi_modal_data (vLLM's: {"image": [...], "video":
        [...]}) its placeholders expanded and its media as the engine takes them."""
        text, ids = self._encode(prompt)
        data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if not data:
            return text, ids, []
        if self.multimodal is None:
            raise ValueError(f"multi_modal_data: {self.model_path} runs text only here (no vision tower loaded)")
        unknown = set(data) - {"image", "video"}
        if unknown:
            raise ValueError(f"multi_modal_data: unknown modality {sorted(unknown)} (image, video)")
        as_list = lambda v: list(v) if isinstance(v, (list, tuple)) else [v]  # noqa: E731
        ids, media = self.multimodal.expand(ids, as_list(data.get("image", [])), as_list(data.get("video", [])))
        return text, ids, media

    def _run(self, encoded: list[tuple[str | None, list[int], list]], params_list: list[SamplingParams],
             priority: list[int] | None = None) -> list[RequestOutput]:
        max_len = self.model_info.max_model_len
        results: list[RequestOutput] = []
        live: dict[int, tuple[RequestOutput, _Sequence]] = {}
        added: list[int] = []
        try:
            prompts, core_params, seqs, tags, media = [], [], [], [], []
            for k, ((text, ids, items), params) in enumerate(zip(encoded, params_list)):
                rid = next(self._ids)
                ro = RequestOutput(request_id=str(rid), prompt=text, prompt_token_ids=ids)
                results.append(ro)
                # A prompt's n sequences are one group, which the fair policy shares slots across.
                tag = _core.SchedulingTag(priority=priority[k] if priority else 0, group=rid + 1)
                for i in range(params.n):
                    prompts.append(ids)
                    media.append(items)
                    tags.append(tag)
                    core_params.append(params.to_core(max_tokens_cap=max(1, max_len - len(ids)), seed_offset=i))
                    detok = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens) if self.tokenizer else None
                    seqs.append((ro, _Sequence(params=params, detok=detok, index=i)))
                    ro.outputs.append(None)  # type: ignore[arg-type]  # filled in below
            # One call: the engine sees the whole batch in the same step.
            added = self.engine.add_requests(prompts, core_params, tags, media if any(media) else [])
            live = dict(zip(added, seqs))
            pending = set(live)
            while pending:
                for out in self.engine.await_outputs(0.05):
                    if out.request_id not in pending:
                        continue
                    ro, seq = live[out.request_id]
                    ro.num_cached_tokens = max(ro.num_cached_tokens, out.num_cached_tokens)
                    if out.prompt_logprobs and seq.index == 0:
                        ro.prompt_logprobs = [None] + [{**{a.token: a.logprob for a in t.top_logprobs}, t.token: t.logprob}
                                                       for t in out.prompt_logprobs]
                    if seq.finish_reason is None and seq.apply(out):
                        # A stop string ended it; wait for the engine to confirm the abort so
                        # that its blocks are free when generate() returns.
                        self.engine.abort(out.request_id)
                    if out.finished:
                        pending.discard(out.request_id)
        except BaseException:
            for rid in added:
                self.engine.abort(rid)
            raise
        for rid, (ro, seq) in live.items():
            if seq.detok is None:
                seq.text = ""
            ro.outputs[seq.index] = CompletionOutput(
                index=seq.index,
                text=seq.text,
                token_ids=seq.token_ids,
                cumulative_logprob=seq.cumulative_logprob if seq.params.logprobs is not None else None,
                logprobs=seq.logprobs if seq.params.logprobs is not None else None,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
                generation_logits=seq.logits if seq.params.return_generation_logits else None,
            )
            ro.finished = True
        return results


def _init_signature() -> inspect.Signature:
    """LLM(...)'s keywords as the option schema has them, for help() and editors."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("model", P.POSITIONAL_OR_KEYWORD, default=None)]
    for name, field in EngineOptions.model_fields.items():
        if name != "model":
            default = field.default_factory() if field.default_factory else field.default
            params.append(P(name, P.KEYWORD_ONLY, default=default, annotation=field.annotation))
    params.append(P("calibration_prompts", P.KEYWORD_ONLY, default=None))
    return inspect.Signature(params)


LLM.__init__.__signature__ = _init_signature()
