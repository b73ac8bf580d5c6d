"""Tokenizer (HF `tokenizers`) and chat template (jinja2) of a model directory."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class ChatTemplateError(ValueError):
    pass


# Texts longer than this are tokenized by the batch calls of `tokenizers`, which release the GIL
# (the single-text calls hold it: a 2 MB text stalled other threads for 0.9 s).
_GIL_FREE_CHARS = 4096


class Tokenizer:
    """Encodes, decodes and renders chat prompts the way the model's own files say."""

    def __init__(self, model_dir: str | Path):
        d = Path(model_dir)
        path = d / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {d}")
        self._tok = HFTokenizer.from_file(str(path))
        cfg_path = d / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.add_bos_token = bool(self.config.get("add_bos_token", False))
        self.chat_template: str | None = self.config.get("chat_template")
        template_file = d / "chat_template.jinja"
        if self.chat_template is None and template_file.is_file():
            self.chat_template = template_file.read_text()
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self._special_ids = {
            i for i, t in self._tok.get_added_tokens_decoder().items() if getattr(t, "special", False)
        }
        self._template = None
        self._max_token_chars: int | None = None

    def use_chat_template(self, template: str) -> None:
        """Renders chats with `template` (Jinja text) instead of the model's own."""
        self.chat_template = template
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def max_token_chars(self) -> int:
        """The longest token's text in characters (a decoded token is never longer)."""
        if self._max_token_chars is None:
            self._max_token_chars = max((len(t) for t in self._tok.get_vocab(with_added_tokens=True)), default=1)
        return self._max_token_chars

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > _GIL_FREE_CHARS:  # the batch call releases the GIL while it works
            ids = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        else:
            ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if len(ids) > _GIL_FREE_CHARS // 4:
            return self._tok.decode_batch([list(ids)], skip_special_tokens=skip_special_tokens)[0]
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        if not self.chat_template:
            raise ChatTemplateError("this model has no chat template; use generate() with plain text")
        if self._template is None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.filters["tojson"] = lambda v, indent=None, ensure_ascii=False: json.dumps(
                v, indent=indent, ensure_ascii=ensure_ascii
            )
            env.globals["raise_exception"] = _raise
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template = env.from_string(self.chat_template)
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **kwargs,
            )
        except ChatTemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - the template runs over whatever the request held
            raise ChatTemplateError(f"chat template failed: {e}") from e


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    A token can end in the middle of a multi-byte character; such text decodes to U+FFFD and is
    held back until the following tokens complete it.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0
        self._read = 0

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        prefix_text = self._tok.decode(self.ids[self._prefix : self._read], self._skip)
        full = self._tok.decode(self.ids[self._prefix :], self._skip)
        if len(full) > len(prefix_text) and not full.endswith("\ufffd"):
            delta = full[len(prefix_text) :]
            self._prefix, self._read = self._read, len(self.ids)
            self.text += delta
            return delta
        return ""
