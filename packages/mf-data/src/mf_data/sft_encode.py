"""Conversations -> token ids and a per-token response mask, with the model's own tokenizer.

`load_tokenizer(path)` takes a sentencepiece `.model` file or a Hugging Face tokenizer directory
(`tokenizer.json`). `ChatEncoder(tokenizer)` then renders conversations with the tokenizer's chat
template, or with the built-in template (`BUILTIN_TEMPLATE_DOC`) when it has none (always for
sentencepiece), cuts the text into prompt and response pieces (`mf_data.chat_template`) and
tokenises each piece on its own. Concatenating the pieces' tokens gives the sample; the mask is
1 on the tokens of trained pieces - the assistant's reply and the end-of-turn/EOS token that
closes it - and 0 on system, user and template text. Tokenising piece by piece makes every
boundary exact, and gives the model the same prompt tokens a generator gives it (the rendered
prompt tokenised on its own, the reply appended token by token).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .chat import Conversation, prompt_conversation
from .chat_template import BUILTIN_TEMPLATE_DOC, builtin_pieces, compile_template, split_rendered
from .errors import InputError
from .hf_tokenizer import HFTokenizer
from .tokenizer import SentencePieceTokenizer

__all__ = ["BUILTIN_TEMPLATE_DOC", "ChatEncoder", "load_tokenizer"]


def load_tokenizer(path: str) -> SentencePieceTokenizer | HFTokenizer:
    """A sentencepiece `.model` file, or a tokenizer directory: a Hugging Face one (`tokenizer.json`),
    or one holding only a sentencepiece `tokenizer.model` (as a checkpoint's `tokenizer/` does)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        model = os.path.join(path, "tokenizer.model")
        if not os.path.isfile(os.path.join(path, "tokenizer.json")) and os.path.isfile(model):
            return SentencePieceTokenizer(model)
        return HFTokenizer(path)
    if os.path.isfile(path):
        return SentencePieceTokenizer(path)
    raise InputError(f"{path}: tokenizer not found (a sentencepiece .model file or a directory with tokenizer.json)")


class ChatEncoder:
    """`encode(conversation) -> (ids, mask)` and `encode_prompt(messages) -> ids`.

    `add_bos` puts the tokenizer's BOS first; it applies to the built-in template only (a chat
    template writes its own BOS) and is rejected with one. `use_template=False` forces the
    built-in template even when the tokenizer has a chat template.
    """

    def __init__(self, tokenizer: Any, *, add_bos: bool = False, use_template: bool = True) -> None:
        self.tokenizer = tokenizer
        source = getattr(tokenizer, "chat_template", None) if use_template else None
        self.add_bos = add_bos
        self._render = None
        self._bos: int | None = None
        self._eos: int | None = None
        if source is not None:
            if add_bos:
                raise InputError(f"{tokenizer.chat_template_origin}: --add-bos applies to the built-in template only; "
                                 "this tokenizer's chat template writes its own BOS")
            self._render = compile_template(source, tokenizer.special_tokens, tokenizer.chat_template_origin)
            self.template = tokenizer.chat_template_origin
        else:
            self.template = "builtin"
            self._eos = tokenizer.eod
            if self._eos is None:
                raise InputError(f"{tokenizer.model_path}: the tokenizer has no chat template and no EOS token, so "
                                 "the built-in template has nothing to end a reply with")
            if add_bos:
                self._bos = tokenizer.bos
                if self._bos is None:
                    raise InputError(f"{tokenizer.model_path}: --add-bos, but the tokenizer has no BOS token")

    def pieces(self, conversation: Conversation, add_generation_prompt: bool = False) -> list[tuple[str | list[int], bool]]:
        """(text or ids, trained) pieces of the rendered conversation."""
        if self._render is not None:
            return list(split_rendered(self._render, conversation.messages, conversation.trained, add_generation_prompt))
        assert self._eos is not None
        return builtin_pieces(conversation.messages, conversation.trained, self._eos, self._bos, add_generation_prompt)

    def _tokenise(self, pieces: Sequence[tuple[str | list[int], bool]]) -> tuple[list[int], list[int]]:
        texts = [p for p, _ in pieces if isinstance(p, str)]
        encoded = iter(self.tokenizer.encode(texts) if texts else [])
        ids: list[int] = []
        mask: list[int] = []
        for piece, trained in pieces:
            part = next(encoded) if isinstance(piece, str) else piece
            ids.extend(part)
            mask.extend([int(trained)] * len(part))
        return ids, mask

    def encode(self, conversation: Conversation) -> tuple[list[int], list[int]]:
        """Token ids of the whole conversation and the response mask (1 = trained)."""
        return self._tokenise(self.pieces(conversation))

    def encode_prompt(self, messages: list[dict]) -> list[int]:
        """Token ids to generate the next assistant reply from, tokenised as in training."""
        ids, _ = self._tokenise(self.pieces(prompt_conversation(messages), add_generation_prompt=True))
        return ids
