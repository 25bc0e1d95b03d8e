"""Run the app with uvicorn on a socket bound up front, so the real port is known before serving.

`serve(engine, ...)` starts the engine thread, compiles the smallest graphs with a warm-up request
(so the first client does not wait for a compile), binds the socket (port 0 picks a free port),
calls `on_ready(url)`, then serves until SIGINT/SIGTERM; in-flight requests finish before it
returns (normally, not by the signal), and the engine thread stops last. If the engine cannot
recover (see runner.py), the server shuts down the same way and `serve` raises RuntimeError: a
process that cannot generate exits instead of answering 503 forever.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..inference.engine import InferenceEngine
from ..inference.sampling import SamplingParams
from .app import ServingTokenizer, create_app
from .protocol import SamplingDefaults, ServerLimits
from .runner import EngineRunner

log = logging.getLogger("mf_models")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (OSError if it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


@contextmanager
def _graceful_signals() -> Iterator[None]:
    """uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal into the handler
    that was there before it; this one just notes it, so a stop requested by a signal ends the
    process normally (exit 0) once in-flight requests are answered."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda number, frame: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(engine: InferenceEngine, *, tokenizer: ServingTokenizer | None = None, model_name: str = "model",
          host: str = "127.0.0.1", port: int = 8000, sock: socket.socket | None = None,
          limits: ServerLimits | None = None, warmup: bool = True, on_ready: Callable[[str], None] | None = None,
          log_level: str = "warning", defaults: SamplingDefaults | None = None) -> None:
    """Serve until interrupted; `sock` (from `bind`) replaces host/port; `defaults` fill in the
    settings requests leave out (OpenAI's, or the model's generation config)."""
    import uvicorn

    sock = sock if sock is not None else bind(host, port)  # before any slow work: a taken port fails at once
    runner = EngineRunner(engine)
    runner.start()
    try:
        if warmup:
            request = engine.submit([0], SamplingParams(max_new_tokens=2, ignore_eos=True))
            request.wait()
            if runner.error is not None:
                raise RuntimeError(f"warm-up failed: {runner.error}")
            engine.stats.reset()
        app = create_app(runner, tokenizer=tokenizer, model_name=model_name, limits=limits, defaults=defaults)
        config = uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=30)
        server = uvicorn.Server(config)

        def fatal(exc: BaseException) -> None:  # from the engine thread; uvicorn polls the flag
            server.should_exit = True

        runner.on_fatal = fatal
        if runner.error is not None:
            raise RuntimeError(f"the engine failed: {runner.error}")
        bound_host, bound_port = sock.getsockname()[:2]
        url = f"http://{'[' + bound_host + ']' if ':' in bound_host else bound_host}:{bound_port}"
        if on_ready is not None:
            on_ready(url)
        with _graceful_signals():
            server.run(sockets=[sock])
        if runner.error is not None:
            raise RuntimeError(f"the engine failed: {runner.error}")
    finally:
        runner.stop()
        sock.close()
