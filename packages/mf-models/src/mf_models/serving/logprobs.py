"""The engine's TokenLogprob entries in OpenAI's two shapes.

Completions (`logprobs: N`, the legacy shape vLLM also serves):

    {"tokens": [text of each token], "token_logprobs": [float | null], "top_logprobs": [{text: float} | null],
     "text_offset": [int]}

`top_logprobs` holds the N most likely tokens and the chosen one (so up to N + 1 entries, as
OpenAI and vLLM answer); with `echo` the prompt's tokens come first, the first of them null (it has
no context to be predicted from). `text_offset` is each token's offset in the returned `text`.

Chat (`logprobs: true, top_logprobs: N`):

    {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"} x N]}], "refusal": null}

A token's text is the text it adds after the tokens before it (sentencepiece writes a word's
leading space only after another token), so the texts of a sequence join to its decoded text.
Without a tokenizer a token reads `token_id:ID` (vLLM's spelling for the same case).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..inference.logprobs import TokenLogprob

CONTEXT = 4   # tokens decoded in front of a token to find its text (see TextStream)


class TokenTexts:
    """The text of token ids in context."""

    def __init__(self, decode: Callable[[list[int]], str] | None):
        self.decode = decode

    def text(self, before: Sequence[int], token: int) -> str:
        if self.decode is None:
            return f"token_id:{token}"
        context = [int(t) for t in before[-CONTEXT:]]
        if not context:
            return self.decode([token])
        head = self.decode(context)
        whole = self.decode(context + [token])
        return whole[len(head):] if whole.startswith(head) else self.decode([token])


class CompletionLogprobs:
    """Builds the completions shape piece by piece (a stream sends each piece with its tokens);
    `offset` runs on over the pieces of one choice."""

    def __init__(self, texts: TokenTexts, offset: int = 0):
        self.texts, self.offset = texts, offset

    def piece(self, ids: Sequence[int], entries: Sequence[TokenLogprob | None], before: Sequence[int]) -> dict:
        history = list(before)
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, entry in zip(ids, entries):
            text = self.texts.text(history, token)
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
            else:
                top: dict[str, float] = {}
                for alt, logprob in entry.top:
                    top.setdefault(self.texts.text(history, alt), logprob)
                top.setdefault(text, entry.logprob)
                out["token_logprobs"].append(entry.logprob)
                out["top_logprobs"].append(top)
            self.offset += len(text)
            history.append(token)
        return out


def _chat_token(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}


def chat_logprobs(texts: TokenTexts, ids: Sequence[int], entries: Sequence[TokenLogprob],
                  before: Sequence[int]) -> dict:
    history = list(before)
    content = []
    for token, entry in zip(ids, entries):
        item = _chat_token(texts.text(history, token), entry.logprob)
        item["top_logprobs"] = [_chat_token(texts.text(history, alt), logprob) for alt, logprob in entry.top]
        content.append(item)
        history.append(token)
    return {"content": content, "refusal": None}
