"""The engine on its own thread, and asyncio streams of each request's tokens.

All MindSpore work happens on one thread (`mf-engine`), which runs the engine's continuous-batching
loop: requests submitted from the event loop join free slots at the next step. The engine calls
each request's `on_update` from that thread; it is turned into `loop.call_soon_threadsafe` so the
tokens arrive in an `asyncio.Queue` the HTTP handler reads. A step that fails ends the requests
it was running with finish_reason "error" (a prefill: that request; a decode: the seated batch)
and the engine goes on. When the engine cannot recover (`EngineFailure`: steps failing in a row,
or anything escaping its loop), every request in flight ends with "error", the runner is marked
unhealthy (`/health` says 503, new requests are refused) and `on_fatal(exc)` is called: `serve`
then stops the server and raises, so the process exits non-zero and a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence

from ..inference.engine import InferenceEngine
from ..inference.sampling import SamplingParams
from ..inference.scheduler import Request

log = logging.getLogger("mf_models")


class TokenStream:
    """Async iterator of (new token ids, finish_reason or None) for one request."""

    def __init__(self, request: Request, queue: asyncio.Queue):
        self.request = request
        self._queue = queue

    def __aiter__(self) -> AsyncIterator[tuple[list[int], str | None]]:
        return self._events()

    async def _events(self) -> AsyncIterator[tuple[list[int], str | None]]:
        while True:
            new_ids, reason = await self._queue.get()
            yield new_ids, reason
            if reason is not None:
                return

    def cancel(self, reason: str = "cancelled") -> None:
        self.request.cancel(reason)


class EngineRunner:
    def __init__(self, engine: InferenceEngine, on_fatal: Callable[[BaseException], None] | None = None):
        self.engine = engine
        self.on_fatal = on_fatal
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mf-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        try:
            self.engine.run_forever(self._stop.is_set)
        except BaseException as exc:  # the engine cannot continue: fail what is in flight, say why
            self.error = exc
            log.error("the engine cannot continue (%s: %s); every request in flight ends with finish_reason "
                      "'error'", type(exc).__name__, exc, exc_info=exc)
            self.engine.abort_all("error")
            if self.on_fatal is not None:
                self.on_fatal(exc)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> TokenStream:
        """Queue a request (call from the event loop). Raises `RequestError` for a bad request."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_update(request: Request, new_ids: list[int]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (list(new_ids), request.finish_reason))

        return TokenStream(self.engine.submit(prompt_ids, params, on_update), queue)
