"""One choice of a response: a request's token stream turned into text, with stop strings applied.

`run_choice` consumes the engine's tokens for one choice, keeps its ids, text, finish reason and
(when asked for) their logprobs, and (when streaming) forwards each piece of releasable text to the
response's event queue. A choice that only scores its prompt (`max_tokens: 0`) keeps none of the
one token the engine chose after it. A stop
string found in the text ends the choice at once (finish_reason "stop", the text cut before it)
and cancels the engine request, which leaves its slot at the next step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..inference.sampling import SamplingParams
from ..inference.text import TextStream
from .runner import TokenStream


@dataclass(eq=False)
class Choice:
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    echo: str = ""                       # the prompt text put in front (completions with echo)
    stream: TokenStream | None = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_token_generated: bool = False   # ended by a stop token: it was generated, but is not returned
    done: bool = False
    arrived_at: float = 0.0              # perf_counter() when the request arrived
    first_token_at: float | None = None  # ... when its first / latest token came out of the engine
    last_token_at: float | None = None
    counted: bool = False                # already in the server's metrics
    score_only: bool = False             # max_tokens 0: the prompt is scored, nothing is generated
    logprobs: list = field(default_factory=list)   # TokenLogprob per token id (logprobs asked for)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids) + self.stop_token_generated


async def run_choice(choice: Choice, decode: Callable[[list[int]], str] | None, stops: list[str],
                     queue: asyncio.Queue | None = None) -> None:
    """Fill `choice` from its stream; with `queue`, put (choice, text delta, new ids, their logprobs,
    finish) per event."""
    text = TextStream(decode, stops, choice.prompt_ids) if decode is not None else None
    request = choice.stream.request
    async for new_ids, reason in choice.stream:
        if choice.score_only:
            new_ids, reason = [], ("length" if reason in ("length", "stop") else reason)
        # the engine appends an id's logprob before it reports the id (same thread, in order)
        entries = request.output_logprobs[len(choice.token_ids):len(choice.token_ids) + len(new_ids)] \
            if request.params.logprobs is not None else []
        choice.logprobs.extend(entries)
        if new_ids:
            choice.last_token_at = time.perf_counter()
            if choice.first_token_at is None:
                choice.first_token_at = choice.last_token_at
        choice.token_ids.extend(new_ids)
        delta = text.push(new_ids) if text is not None else ""
        if text is not None and text.stopped and reason is None:
            choice.stream.cancel("stop")
            reason = "stop"
        elif reason == "stop":
            choice.stop_token_generated = choice.stream.request.stop_token is not None
        if reason is not None:
            delta += text.finish() if text is not None else ""
            choice.finish_reason = reason
            choice.done = True
        if text is not None:
            choice.text = text.text
        if queue is not None:
            queue.put_nowait((choice, delta, list(new_ids), list(entries), reason))
        if reason is not None:
            return
