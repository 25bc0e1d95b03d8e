"""The tokenizer over HTTP, as vLLM serves it, so clients (lm-evaluation-harness' `local-completions`,
token counters) use the server's own tokenizer instead of looking for one on a hub:

    POST /tokenize         {"prompt": text} or {"messages": [...]} (+ "add_special_tokens",
                           "add_generation_prompt", "return_token_strs")
                           -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize       {"tokens": [ids]} -> {"prompt": text}
    GET  /tokenizer_info   {"tokenizer_class", "bos_token", "eos_token", "unk_token", "pad_token",
                           "model_max_length", "add_bos_token", "add_eos_token", "chat_template"}

Text is encoded exactly as a text prompt of /v1/completions is (`TextEncoder`): the tokenizer's
special-token strings written in the text (`</s>`) are those tokens, as with every Hugging Face
tokenizer and so vLLM; the rest is the tokenizer's own encoding. mf's tokenizers add no BOS or
EOS to an encoded text (`add_bos_token` false), so `add_special_tokens` has nothing to add either
way. A text longer than the context is tokenised all the same (clients count tokens to cut
documents into windows); the limit on the request body still applies.
"""

from __future__ import annotations

import re
from typing import Any

from .logprobs import TokenTexts
from .protocol import APIError, _bad, _bool, _shown, check_token_ids

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class TextEncoder:
    """Text -> ids with the tokenizer's special-token strings matched as their tokens.

    The tokenizer may offer `special_tokens` ({HF name: text}) and `token_to_id(text)`; one
    without them encodes text as it is."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        names = getattr(tokenizer, "special_tokens", None) or {}
        to_id = getattr(tokenizer, "token_to_id", None)
        self.names = {name: names.get(name) for name in SPECIAL_NAMES}
        self.specials: dict[str, int] = {}
        for text in self.names.values():
            token = to_id(text) if text and to_id is not None else None
            if token is not None:
                self.specials[text] = int(token)
        # longest first, so a special token that contains another is matched whole
        alternatives = "|".join(re.escape(t) for t in sorted(self.specials, key=len, reverse=True))
        self.pattern = re.compile(f"({alternatives})") if alternatives else None

    def encode(self, text: str) -> list[int]:
        if self.pattern is None:
            return list(self.tokenizer.encode(text))
        ids: list[int] = []
        for i, part in enumerate(self.pattern.split(text)):
            if i % 2:
                ids.append(self.specials[part])
            elif part:
                ids.extend(self.tokenizer.encode(part))
        return ids


def tokenize(server: Any, body: dict) -> dict:
    encoder: TextEncoder = server.text
    allowed = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "return_token_strs",
               "continue_final_message"}
    for key in body:
        if key not in allowed:
            raise APIError(400, f"Unrecognized request argument supplied: {key}", key)
    _bool(body, "add_special_tokens", True)     # nothing to add: see the module docstring
    if ("prompt" in body) == ("messages" in body):
        raise _bad("prompt", "give exactly one of prompt (a string) or messages (a chat)")
    if "prompt" in body:
        for key in ("add_generation_prompt", "continue_final_message"):
            if key in body:
                raise _bad(key, "applies to messages, not to a prompt")
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise _bad("prompt", f"must be a string, got {_shown(prompt)}")
        ids = encoder.encode(prompt)
    else:
        from .protocol import parse_chat

        if not _bool(body, "add_generation_prompt", True) or _bool(body, "continue_final_message"):
            raise _bad("add_generation_prompt", "chats are rendered with the generation prompt (the assistant's turn "
                                                "opened), as /v1/chat/completions renders them")
        job = parse_chat({"messages": body["messages"]}, server.limits, server.max_tokens_cap, server.vocab_size)
        try:
            ids = list(encoder.tokenizer.encode_chat(job.prompts[0]))
        except ValueError as exc:
            raise APIError(400, f"messages: {exc}", "messages") from None
    texts = None
    if _bool(body, "return_token_strs"):
        reader = TokenTexts(encoder.tokenizer.decode)
        texts = [reader.text(ids[max(0, i - 4):i], t) for i, t in enumerate(ids)]
    return {"count": len(ids), "max_model_len": server.max_len, "tokens": ids, "token_strs": texts}


def detokenize(server: Any, body: dict) -> dict:
    for key in body:
        if key not in ("model", "tokens"):
            raise APIError(400, f"Unrecognized request argument supplied: {key}", key)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise _bad("tokens", "must be a list of token ids")
    check_token_ids(tokens, server.vocab_size, "tokens")
    return {"prompt": server.text.tokenizer.decode(tokens)}


def tokenizer_info(server: Any) -> dict:
    encoder: TextEncoder = server.text
    tokenizer = encoder.tokenizer
    return {"tokenizer_class": getattr(tokenizer, "tokenizer_class", type(tokenizer).__name__), **encoder.names,
            "model_max_length": server.max_len, "add_bos_token": False, "add_eos_token": False,
            "chat_template": getattr(tokenizer, "chat_template", None)}
