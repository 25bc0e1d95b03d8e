"""The HTTP application: OpenAI-compatible completions and chat over the engine runner (Starlette).

    GET  /health                 {"status": "ok"} or 503 when the engine thread has failed
    GET  /metrics                Prometheus metrics (metrics.py): requests, tokens, queue, latencies
    GET  /v1/models              the one served model
    POST /v1/completions         prompt(s) as text or token ids; stream: true -> server-sent events;
                                 logprobs, echo (max_tokens 0 with echo scores the prompt)
    POST /v1/chat/completions    messages rendered by the tokenizer's chat template; logprobs
    POST /tokenize, /detokenize, GET /tokenizer_info   the tokenizer, as vLLM serves it (tokenization.py)

Settings a request leaves out come from `defaults` (SamplingDefaults: OpenAI's, or the model's
generation config).

Every error is JSON in OpenAI's shape with a 4xx/5xx status: 400 for a bad field (named in `param`),
404 for an unknown model or route, 405 for a wrong method, 413 for a body over the byte limit,
503 when the queue is full or the engine is down, 500 if generation fails. A prompt longer than
the context, or one that leaves no room for max_tokens, is a 400 with code
`context_length_exceeded` (OpenAI's). A string holding a lone UTF-16 surrogate (`"\ud800"`, valid
JSON but no text) is a 400 naming where it is.

A client that goes away is not served further: a request whose connection closes while its body
arrives is dropped without a log line (counted as status 499 in /metrics), and a non-streaming
request whose client leaves while it generates is cancelled, freeing its slot at the next engine
step (a stream's generator is stopped the same way when its client leaves).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..inference.scheduler import RequestError
from . import tokenization
from .choices import Choice, run_choice
from .logprobs import CompletionLogprobs, TokenTexts, chat_logprobs
from .metrics import MetricsMiddleware, ServerMetrics
from .protocol import APIError, Job, SamplingDefaults, ServerLimits, parse_chat, parse_completion
from .runner import EngineRunner

log = logging.getLogger("mf_models")


class ServingTokenizer(Protocol):
    """What the server needs from a tokenizer. `encode_chat` renders messages with the model's
    chat template (generation prompt included) and tokenises them; it raises ValueError for
    messages the template cannot render.

    Optional, read when present (tokenization.py): `special_tokens` ({"bos_token": text, ...}),
    `token_to_id(text)` (so those strings in a text prompt are their tokens), `chat_template`
    and `tokenizer_class` (for /tokenizer_info)."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]: ...


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


class ClientGone(Exception):
    """The client closed its connection before its request was read: nobody to answer."""


CLIENT_CLOSED_REQUEST = 499   # nginx's status for it; never sent, only counted in /metrics


def _answers(handler: Callable) -> Callable:
    """A route that answers APIError with its JSON, and a client gone mid-body with nothing."""

    async def route(self, request: HTTPRequest) -> Response:
        try:
            return await handler(self, request)
        except APIError as exc:
            return _error(exc)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED_REQUEST)

    return route


def _lone_surrogate(data: Any) -> str | None:
    """Where the first string holding a lone UTF-16 surrogate is (`messages[0].content`), or None.
    Iterative: json.loads' own nesting limit is deeper than a recursive walk may go."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or "request body"
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                if _lone_surrogate(key) is not None:
                    return f"{path}.<key>" if path else "<key>"
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


async def _read_json(request: HTTPRequest, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes",
                       code="request_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
    except ClientDisconnect:
        raise ClientGone() from None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "request body is not valid JSON") from None
    except RecursionError:  # `[[[[...` a hundred thousand deep: the parser's own limit
        raise APIError(400, "request body nests too deeply") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object")
    where = _lone_surrogate(data)
    if where is not None:
        param = where.split(".")[0].split("[")[0]
        raise APIError(400, f"{where}: holds a lone UTF-16 surrogate (an escape such as \\ud800 without its pair), "
                            "which is not text", None if param in ("request body", "<key>") else param)
    return data


async def _until_disconnected(request: HTTPRequest) -> None:
    """Returns once the client has gone (its body already read: the next message is the end)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Server:
    """The routes' shared state: runner, tokenizer, model name, limits, request defaults, metrics."""

    def __init__(self, runner: EngineRunner, tokenizer: ServingTokenizer | None, model_name: str,
                 limits: ServerLimits, defaults: SamplingDefaults | None = None):
        self.runner, self.tokenizer, self.model_name, self.limits = runner, tokenizer, model_name, limits
        self.defaults = defaults or SamplingDefaults()
        self.metrics = ServerMetrics(runner)
        self.created = int(time.time())
        engine = runner.engine
        self.max_len = engine.max_len
        self.vocab_size = engine.vocab_size
        self.max_tokens_cap = max(1, min(limits.max_tokens, engine.max_len - 1))
        self.max_prompt_tokens = min(limits.max_prompt_tokens or engine.max_len - 1, engine.max_len - 1)
        self.text = tokenization.TextEncoder(tokenizer) if tokenizer is not None else None
        self.token_texts = TokenTexts(tokenizer.decode if tokenizer is not None else None)

    # ---- routes --------------------------------------------------------------------------------
    async def health(self, request: HTTPRequest) -> Response:
        if not self.runner.healthy:
            reason = f"engine failed: {self.runner.error}" if self.runner.error else "engine stopped"
            return JSONResponse({"status": "error", "detail": reason}, status_code=503)
        engine = self.runner.engine
        return JSONResponse({"status": "ok", "active": len(engine.scheduler.active()),
                             "waiting": engine.scheduler.waiting, "slots": engine.max_slots})

    async def prometheus(self, request: HTTPRequest) -> Response:
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def models(self, request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "mf",
             "max_model_len": self.max_len}]})

    @_answers
    async def completions(self, request: HTTPRequest) -> Response:
        arrived = time.perf_counter()
        body = await _read_json(request, self.limits.max_request_bytes)
        self._check_model(body)
        job = parse_completion(body, self.limits, self.max_tokens_cap, self.vocab_size, self.defaults)
        prompt_ids = [self._encode(p) for p in job.prompts]
        return await self._respond(job, prompt_ids, [self._prompt_text(p, ids) for p, ids in zip(job.prompts, prompt_ids)],
                                   arrived, request)

    @_answers
    async def chat(self, request: HTTPRequest) -> Response:
        arrived = time.perf_counter()
        body = await _read_json(request, self.limits.max_request_bytes)
        self._check_model(body)
        job = parse_chat(body, self.limits, self.max_tokens_cap, self.vocab_size, self.defaults)
        if self.tokenizer is None:
            raise APIError(400, "this server has no tokenizer, so it cannot render chat messages; "
                                "use /v1/completions with token ids", "messages")
        try:
            ids = self.tokenizer.encode_chat(job.prompts[0])
        except ValueError as exc:
            raise APIError(400, f"messages: {exc}", "messages") from None
        return await self._respond(job, [ids], [""], arrived, request)

    def _need_tokenizer(self) -> None:
        if self.tokenizer is None:
            raise APIError(404, "this server has no tokenizer (it serves token ids only)", code="no_tokenizer")

    @_answers
    async def tokenize(self, request: HTTPRequest) -> Response:
        body = await _read_json(request, self.limits.max_request_bytes)
        self._check_model(body)
        self._need_tokenizer()
        return JSONResponse(tokenization.tokenize(self, body))

    @_answers
    async def detokenize(self, request: HTTPRequest) -> Response:
        body = await _read_json(request, self.limits.max_request_bytes)
        self._check_model(body)
        self._need_tokenizer()
        return JSONResponse(tokenization.detokenize(self, body))

    @_answers
    async def tokenizer_info(self, request: HTTPRequest) -> Response:
        self._need_tokenizer()
        return JSONResponse(tokenization.tokenizer_info(self))

    # ---- helpers -------------------------------------------------------------------------------
    def _check_model(self, body: dict) -> None:
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist; this server serves `{self.model_name}`",
                           "model", code="model_not_found")

    def _encode(self, prompt: Any) -> list[int]:
        if not isinstance(prompt, str):
            return prompt
        if self.tokenizer is None:
            raise APIError(400, "this server has no tokenizer: send the prompt as token ids", "prompt")
        ids = self.text.encode(prompt)
        if not ids:
            raise APIError(400, "prompt: encodes to no tokens", "prompt")
        return ids

    def _prompt_text(self, prompt: Any, ids: list[int]) -> str:
        if isinstance(prompt, str):
            return prompt
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    def _choices(self, job: Job, prompt_ids: list[list[int]], prompt_texts: list[str], arrived: float) -> list[Choice]:
        choices = []
        default = self.defaults.max_tokens if self.defaults.max_tokens is not None else (None if job.chat else 16)
        for i, ids in enumerate(prompt_ids):
            param = "messages" if job.chat else "prompt"
            if len(ids) > self.max_prompt_tokens:
                raise APIError(400, f"{param}: {len(ids)} tokens exceed the limit of {self.max_prompt_tokens} prompt "
                                    "tokens", param, code="context_length_exceeded")
            room = self.max_len - len(ids)
            if job.max_tokens is None:  # a default: as much of it as fits
                max_tokens = min(self.max_tokens_cap, room, default if default is not None else room)
            else:
                max_tokens = job.max_tokens
            if max_tokens > room:
                raise APIError(400, f"This model's maximum context length is {self.max_len} tokens. However, you "
                                    f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} "
                                    "for the completion). Reduce the prompt or max_tokens.", "max_tokens",
                               code="context_length_exceeded")
            for j in range(job.n):
                seed = job.params.seed + j if job.params.seed is not None else None
                # max_tokens 0 scores the prompt: the engine's one token after it is dropped
                params = dataclasses.replace(job.params, max_new_tokens=max(max_tokens, 1), seed=seed)
                choices.append(Choice(len(choices), ids, params, prompt_texts[i] if job.echo else "",
                                      arrived_at=arrived, score_only=max_tokens == 0))
        return choices

    def _submit(self, choices: list[Choice]) -> None:
        if not self.runner.healthy:
            raise APIError(503, "the engine is not running", type="server_error")
        if self.runner.engine.scheduler.waiting + len(choices) > self.limits.max_waiting:
            raise APIError(503, "the server is busy (request queue full); retry later", type="server_overloaded")
        try:
            for choice in choices:
                choice.stream = self.runner.submit(choice.prompt_ids, choice.params)
        except RequestError as exc:
            for choice in choices:
                if choice.stream is not None:
                    choice.stream.cancel()
            raise APIError(400, str(exc), "prompt") from None

    async def _respond(self, job: Job, prompt_ids: list[list[int]], prompt_texts: list[str],
                       arrived: float, request: HTTPRequest) -> Response:
        if job.stop and self.tokenizer is None:
            raise APIError(400, "stop: stop strings need a tokenizer, and this server has none; use stop_token_ids",
                           "stop")
        choices = self._choices(job, prompt_ids, prompt_texts, arrived)
        self._submit(choices)
        if job.user:
            log.info("request for user %r: %d choice(s)", job.user, len(choices))
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        rid = ("chatcmpl-" if job.chat else "cmpl-") + uuid.uuid4().hex
        if job.stream:
            return StreamingResponse(self._events(job, choices, decode, rid), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        generating = asyncio.ensure_future(asyncio.gather(*(run_choice(c, decode, job.stop) for c in choices)))
        watching = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait((generating, watching), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not generating.done():   # the client left (or the handler was cancelled): stop generating
                generating.cancel()
            generating.add_done_callback(_retrieved)   # its CancelledError is expected, not worth a log line
            for c in choices:
                if not c.done:
                    c.stream.cancel()
            self.metrics.observe_choices(choices)
        if not generating.done() or generating.cancelled():
            raise ClientGone()
        generating.result()
        if any(c.finish_reason == "error" for c in choices):
            raise APIError(500, "generation failed in the engine (see the server log)")
        out = [self._choice_body(job, c, c.text) for c in choices]
        return JSONResponse({"id": rid, "object": "chat.completion" if job.chat else "text_completion",
                             "created": int(time.time()), "model": self.model_name, "choices": out,
                             "usage": _usage(choices)})

    def _choice_body(self, job: Job, choice: Choice, text: str, finish: str | None = None, last: bool = True) -> dict:
        finish = choice.finish_reason if last else finish
        if job.chat:
            logprobs = None if job.logprobs is None else \
                chat_logprobs(self.token_texts, choice.token_ids, choice.logprobs, choice.prompt_ids)
            return {"index": choice.index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                    "finish_reason": finish, "token_ids": choice.token_ids}
        logprobs = None
        if job.logprobs is not None:
            builder = CompletionLogprobs(self.token_texts)
            logprobs = self._echo_logprobs(job, choice, builder)
            _extend(logprobs, builder.piece(choice.token_ids, choice.logprobs, choice.prompt_ids))
        return {"index": choice.index, "text": choice.echo + text, "logprobs": logprobs, "finish_reason": finish,
                "token_ids": choice.token_ids}

    def _echo_logprobs(self, job: Job, choice: Choice, builder: CompletionLogprobs) -> dict:
        """The prompt's part of a completion's logprobs: its tokens with echo, else nothing."""
        if not job.echo:
            return builder.piece([], [], [])
        scored = choice.stream.request.prompt_logprobs   # None only if the request ended before its prefill
        return builder.piece(choice.prompt_ids, scored or [None] * len(choice.prompt_ids), [])

    async def _events(self, job: Job, choices: list[Choice], decode: Callable | None, rid: str) -> AsyncIterator[str]:
        created = int(time.time())
        kind = "chat.completion.chunk" if job.chat else "text_completion"
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(run_choice(c, decode, job.stop, queue)) for c in choices]

        def chunk(choice_bodies: list[dict], usage: dict | None = None) -> str:
            body = {"id": rid, "object": kind, "created": created, "model": self.model_name, "choices": choice_bodies}
            if usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        builders = {c.index: CompletionLogprobs(self.token_texts) for c in choices}
        echoed: set[int] = set()
        try:
            if job.chat:
                yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for c in choices])
            elif job.echo and job.logprobs is None:
                yield chunk([{"index": c.index, "text": c.echo, "logprobs": None, "finish_reason": None}
                             for c in choices])
            remaining = len(choices)
            while remaining:
                choice, text, new_ids, entries, finish = await queue.get()
                if finish == "error":
                    yield f"data: {json.dumps(APIError(500, 'generation failed in the engine').body())}\n\n"
                    return
                before = choice.prompt_ids + choice.token_ids[:len(choice.token_ids) - len(new_ids)]
                if job.chat:
                    delta = {"content": text} if text else {}
                    logprobs = None if job.logprobs is None else \
                        chat_logprobs(self.token_texts, new_ids, entries, before)
                    body = {"index": choice.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                            "token_ids": new_ids}
                else:
                    logprobs = None
                    if job.logprobs is not None:
                        builder = builders[choice.index]
                        if job.echo and choice.index not in echoed:  # the prompt's scores come with its first piece
                            echoed.add(choice.index)
                            text = choice.echo + text
                            logprobs = self._echo_logprobs(job, choice, builder)
                        else:
                            logprobs = builder.piece([], [], [])
                        _extend(logprobs, builder.piece(new_ids, entries, before))
                    body = {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": finish,
                            "token_ids": new_ids}
                if text or new_ids or finish:
                    yield chunk([body])
                remaining -= finish is not None
            if job.include_usage:
                yield chunk([], _usage(choices))
            yield "data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()
            for c in choices:
                if not c.done:
                    c.stream.cancel()
            self.metrics.observe_choices(choices)


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _extend(logprobs: dict, more: dict) -> None:
    for key, values in more.items():
        logprobs[key].extend(values)


def _usage(choices: list[Choice]) -> dict[str, int]:
    prompt = sum(len(c.prompt_ids) for c in choices)
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _http_error(request: HTTPRequest, exc: Exception) -> Response:
    status = getattr(exc, "status_code", 500)
    message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed on {request.url.path}"}
    return _error(APIError(status, message.get(status, getattr(exc, "detail", "error"))))


async def _internal_error(request: HTTPRequest, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path, exc_info=exc)
    return _error(APIError(500, "internal server error (see the server log)"))


def create_app(runner: EngineRunner, *, tokenizer: ServingTokenizer | None = None, model_name: str = "model",
               limits: ServerLimits | None = None, defaults: SamplingDefaults | None = None) -> Starlette:
    """The Starlette app over a started (or about to be started) `EngineRunner`; `defaults` fill in
    the sampling settings requests leave out (e.g. `SamplingDefaults.from_generation_config(...)`)."""
    server = Server(runner, tokenizer, model_name, limits or ServerLimits(), defaults)
    routes = [Route("/health", server.health, methods=["GET"]),
              Route("/metrics", server.prometheus, methods=["GET"]),
              Route("/v1/models", server.models, methods=["GET"]),
              Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/chat/completions", server.chat, methods=["POST"]),
              Route("/tokenize", server.tokenize, methods=["POST"]),
              Route("/detokenize", server.detokenize, methods=["POST"]),
              Route("/tokenizer_info", server.tokenizer_info, methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _internal_error},
                    middleware=[Middleware(MetricsMiddleware, metrics=server.metrics)])
    app.state.server = server
    return app
