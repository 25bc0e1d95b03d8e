"""A Hugging Face tokenizer directory, read with the `tokenizers` library (no `transformers`).

The directory needs `tokenizer.json`. `tokenizer_config.json` (optional) supplies the special
tokens (`bos_token`, `eos_token`, `unk_token`, `pad_token`: a string or `{"content": ...}`) and
`chat_template` (a string, or a list of `{"name", "template"}` of which "default" is used); a
`chat_template.jinja` file beside it takes precedence, as in recent `transformers`, which saves
the template there. Text is encoded with `add_special_tokens=False`, as `apply_chat_template`
does: a chat template writes its own BOS. Special tokens written in the text (e.g.
`<|im_end|>`) are recognised by `tokenizers` as the added tokens they are.

`tokenizers` is part of the `hf` extra (`pip install "mf-data[hf]"`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from .errors import InputError

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise InputError(f"{where}: expected a token string or {{\"content\": ...}}, got {value!r}")


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: not readable as JSON ({err})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    return data


class HFTokenizer:
    """`tokenizer.json` (+ `tokenizer_config.json`): `vocab_size`, `eod`, `bos`, `encode`,
    `decode`, `special_tokens` (name -> text), `token_to_id(text)` and `chat_template` (jinja
    source or None)."""

    def __init__(self, directory: str) -> None:
        self.model_path = os.fspath(directory)
        path = os.path.join(self.model_path, "tokenizer.json")
        if not os.path.isfile(path):
            raise InputError(f"{self.model_path}: no tokenizer.json (a Hugging Face tokenizer directory needs one; "
                             "for a sentencepiece model pass the .model file itself)")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise InputError("the tokenizers package is not installed: pip install 'mf-data[hf]'") from None
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as err:  # tokenizers raises its own Exception type for malformed files
            raise InputError(f"{path}: not a tokenizers file ({str(err).splitlines()[0] if str(err) else err})") from None
        config_path = os.path.join(self.model_path, "tokenizer_config.json")
        config = _read_json(config_path) if os.path.isfile(config_path) else {}
        self.special_tokens = {name: _token_text(config.get(name), f"{config_path}: {name}") for name in SPECIAL_TOKEN_NAMES}
        self.chat_template, self.chat_template_origin = self._template(config, config_path)

    def _template(self, config: dict, config_path: str) -> tuple[str | None, str | None]:
        jinja_path = os.path.join(self.model_path, "chat_template.jinja")
        if os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                return f.read(), jinja_path
        value = config.get("chat_template")
        if value is None:
            return None, None
        if isinstance(value, list):
            named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
            value = named.get("default")
            if value is None:
                raise InputError(f"{config_path}: chat_template lists named templates ({', '.join(map(str, named))}) "
                                 "but none is called 'default'")
        if not isinstance(value, str):
            raise InputError(f"{config_path}: chat_template must be a string, got {type(value).__name__}")
        return value, config_path

    def _id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self._tok.token_to_id(text)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eod(self) -> int | None:
        return self._id("eos_token")

    @property
    def bos(self) -> int | None:
        return self._id("bos_token")

    def token_to_id(self, text: str) -> int | None:
        """The id of the token spelled `text` (a special token's string, a vocabulary entry), or None."""
        return self._tok.token_to_id(text)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        # One call per text: the batch API runs a thread pool, which does not survive fork()
        # into preprocessing workers; parallelism comes from the worker processes instead.
        return [self._tok.encode(t, add_special_tokens=False).ids for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def __getstate__(self) -> str:
        return self.model_path

    def __setstate__(self, state: str) -> None:
        self.__init__(state)  # type: ignore[misc]
