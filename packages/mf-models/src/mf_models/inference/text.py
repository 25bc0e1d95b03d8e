"""Token ids -> text as they arrive, with stop strings: the text layer over the engine's token stream.

The engine knows token ids only; stop *strings* need the tokenizer, so the caller feeds each
request's new ids to a `TextStream` and cancels the request (reason "stop") once `stopped`.

- Text is decoded from the whole completion each time (tokenizers merge bytes and spaces across
  tokens, so decoding token by token would be wrong), with up to `context` prompt tokens in
  front: sentencepiece drops a word's leading space at the start of a decode, which would glue the
  completion to the prompt.
- What is released (`push`'s return value) never has to be taken back: a trailing U+FFFD (a
  multi-byte character cut in half) and any tail that could be the start of a stop string are held
  until the next tokens decide; `finish()` releases the rest.
- With a stop string the text ends right before its first occurrence (the string itself is not
  part of the completion, as in OpenAI's API).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[list[int]], str]


class TextStream:
    def __init__(self, decode: Decode, stop_strings: Sequence[str] = (), prompt_ids: Sequence[int] = (),
                 context: int = 4):
        self.decode = decode
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.prefix = [int(t) for t in list(prompt_ids)[-context:]] if context > 0 else []
        self.prefix_text = decode(self.prefix) if self.prefix else ""
        self.ids: list[int] = []
        self.text = ""                # the completion so far (cut at a stop string once found)
        self.sent = 0                 # characters of `text` already released
        self.stop_string: str | None = None

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    def _decoded(self) -> str:
        if not self.prefix:
            return self.decode(self.ids)
        full = self.decode(self.prefix + self.ids)
        if full.startswith(self.prefix_text):
            return full[len(self.prefix_text):]
        return self.decode(self.ids)  # the prefix did not decode stably: fall back to the ids alone

    def push(self, new_ids: Sequence[int]) -> str:
        """Add ids; return the newly releasable text."""
        if self.stopped or not new_ids:
            return ""
        self.ids.extend(int(t) for t in new_ids)
        text = self._decoded()
        first = None
        for stop in self.stop_strings:
            # a stop string may straddle released text and the new tokens: search from its earliest start
            at = text.find(stop, max(0, self.sent - len(stop) + 1))
            if at >= 0 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            self.stop_string = first[1]
            self.text = text[:first[0]]
            return self._release(len(self.text))
        self.text = text
        safe = len(text)
        while safe > self.sent and text[safe - 1] == "\ufffd":
            safe -= 1
        hold = 0
        for stop in self.stop_strings:
            for n in range(min(len(stop) - 1, safe - self.sent), hold, -1):
                if text[safe - n:safe] == stop[:n]:
                    hold = n
                    break
        return self._release(safe - hold)

    def finish(self) -> str:
        """The rest of the text (nothing is held back any more)."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out = self.text[self.sent:upto]
        self.sent = upto
        return out
