"""OpenAI request bodies -> validated generation jobs, and OpenAI's error shape.

Every field OpenAI defines for `/v1/completions` and `/v1/chat/completions` is either honoured or
rejected with a 400 that names it (e.g. non-zero penalties, tools): a request is never
answered as if a setting had been applied when it was not. Unknown fields are rejected as OpenAI
does ("Unrecognized request argument supplied"). Extensions, as vLLM spells them: `top_k`,
`stop_token_ids`, `ignore_eos`, and `token_ids` in every returned choice.

Log-probabilities: completions take `logprobs` 0..20 (with `echo`, the prompt's tokens are scored
too, and `max_tokens: 0` scores the prompt without generating); chat takes `logprobs: true` and
`top_logprobs` 0..20. See serving/logprobs.py for the shapes and inference/logprobs.py for what
the numbers are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..inference.logprobs import MAX_LOGPROBS
from ..inference.sampling import SamplingParams


class APIError(Exception):
    """An HTTP error answered as {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, type: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or ("invalid_request_error" if 400 <= status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ServerLimits:
    """Bounds of what one request may ask for (each violation is a 4xx, never a truncation)."""

    max_request_bytes: int = 1_000_000
    max_tokens: int = 1024            # largest max_tokens accepted (also capped by the engine's max_len)
    max_prompt_tokens: int | None = None  # default: the engine's max_len - 1
    max_n: int = 8                    # choices per prompt
    max_prompts: int = 16             # prompts in one /v1/completions batch
    max_stop: int = 4                 # stop strings (OpenAI's limit)
    max_waiting: int = 256            # queued requests before new ones get 503
    max_stop_token_ids: int = 64      # stop_token_ids per request


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request gets for the settings it leaves out: OpenAI's defaults, or those of the
    model's generation config (`from_generation_config`), as `generate()` would apply them.

    `temperature` 0 means greedy. `max_tokens` None means the endpoint's own default (16 for
    completions, as OpenAI; as much as fits for chat); a default is cut to what fits in the
    context, a value the request gives is checked against it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    source: str = "OpenAI's defaults"

    @classmethod
    def from_generation_config(cls, config: dict | None, where: str = "generation config") -> SamplingDefaults:
        """From HF's generation_config.json fields: `do_sample: false` means greedy (what
        `generate()` does); otherwise `temperature`, `top_p`, `top_k` and `max_new_tokens` as given
        (absent: OpenAI's values, and top_k off). Raises ValueError naming a bad field."""
        if not config:
            return cls()

        def number(key: str, default: float, low: float, high: float, low_open: bool = True) -> float:
            value = config.get(key)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value > high or value < low or (low_open and value == low):
                raise ValueError(f"{where}: {key} must be a number in {'(' if low_open else '['}{low}, {high}], "
                                 f"got {_shown(value)}")
            return float(value)

        def integer(key: str, low: int) -> int | None:
            value = config.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT32_MAX:
                raise ValueError(f"{where}: {key} must be an integer in [{low}, {INT32_MAX}], got {_shown(value)}")
            return value

        do_sample = config.get("do_sample")
        if do_sample is not None and not isinstance(do_sample, bool):
            raise ValueError(f"{where}: do_sample must be true or false, got {_shown(do_sample)}")
        temperature = number("temperature", 1.0, 0.0, 100.0)
        top_p = number("top_p", 1.0, 0.0, 1.0)
        top_k = integer("top_k", 0) or 0
        max_tokens = integer("max_new_tokens", 1)
        if do_sample is False:
            return cls(0.0, 1.0, 0, max_tokens, f"{where} (do_sample false: greedy)")
        return cls(temperature, top_p, top_k, max_tokens, where)

    def describe(self) -> str:
        sampling = "greedy" if self.temperature == 0 else \
            f"temperature {self.temperature:g}, top_p {self.top_p:g}, top_k {self.top_k or 'off'}"
        tokens = f", max_tokens {self.max_tokens}" if self.max_tokens is not None else ""
        return f"{sampling}{tokens} ({self.source})"


@dataclass
class Job:
    """One validated request: prompts (text or ids) and how to continue each."""

    chat: bool
    prompts: list[Any]                # str | list[int] (completions) or messages (chat)
    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    echo: bool = False
    max_tokens: int | None = None     # as the request gives it; None: the default (SamplingDefaults)
    user: str | None = None
    logprobs: int | None = None       # alternatives per token when logprobs are asked for, else None


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param)


# Every integer a request carries ends up in a fixed-width array on the engine (int32 settings,
# int64 seeds): anything wider is refused here, never left to overflow on the engine thread.
INT32_MAX = 2**31 - 1
SEED_MAX = 2**63 - 1


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int(body: dict, key: str, default: Any, low: int | None = None, high: int | None = None) -> Any:
    value = body.get(key)
    if value is None:  # absent (or null): the default, which is the server's own choice
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, f"must be an integer, got {_shown(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise _bad(key, f"must be {bounds}, got {_shown(value)}")
    return value


def _number(body: dict, key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(key, f"must be a number, got {_shown(value)}")
    if isinstance(value, int) and abs(value) > 2**53:
        raise _bad(key, f"must be in {'(' if low_open else '['}{low}, {high}], got {_shown(value)}")
    if not math.isfinite(value):
        raise _bad(key, f"must be a finite number, got {value}")
    if value < low or value > high or (low_open and value == low):
        raise _bad(key, f"must be in {'(' if low_open else '['}{low}, {high}], got {value}")
    return float(value)


def _bool(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(key, f"must be true or false, got {value!r}")
    return value


def _ids(value: Any, param: str) -> list[int]:
    if not value or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise _bad(param, "token id lists must be non-empty lists of integers")
    return list(value)


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    """Token ids of a request must name tokens of the vocabulary (checked before anything decodes them)."""
    for t in ids:
        if not 0 <= t < vocab_size:
            raise _bad(param, f"token id {_shown(t)} is outside the vocabulary [0, {vocab_size})")


# (field, value accepted as "off") for OpenAI settings this server does not implement
_OFF_ONLY = {"presence_penalty": (None, 0, 0.0),
             "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "suffix": (None, ""),
             "tools": (None, []), "tool_choice": (None, "none"), "parallel_tool_calls": (None,),
             "functions": (None, []), "function_call": (None, "none")}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
           "stop_token_ids", "seed", "ignore_eos", "user", "logprobs", "presence_penalty", "frequency_penalty",
           "logit_bias"}
_COMPLETION_KEYS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT_KEYS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                        "tool_choice", "parallel_tool_calls", "functions", "function_call"}


def _check_keys(body: dict, allowed: set[str]) -> None:
    for key in body:
        if key not in allowed:
            raise APIError(400, f"Unrecognized request argument supplied: {key}", key)
    for key, accepted in _OFF_ONLY.items():
        value = body.get(key)
        if value is not None and not any(value == a and type(value) is type(a) for a in accepted if a is not None):
            raise _bad(key, f"is not supported by this server (got {_shown(value)})")


def _stop_strings(body: dict, limits: ServerLimits) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _bad("stop", "must be a non-empty string or a list of them")
    if len(stops) > limits.max_stop:
        raise _bad("stop", f"at most {limits.max_stop} stop strings, got {len(stops)}")
    return stops


def _sampling(body: dict, limits: ServerLimits, max_tokens: int, vocab_size: int | None,
              defaults: SamplingDefaults, logprobs: int | None = None, prompt_logprobs: int | None = None
              ) -> SamplingParams:
    temperature = _number(body, "temperature", defaults.temperature, 0.0, 2.0)
    top_p = _number(body, "top_p", defaults.top_p, 0.0, 1.0, low_open=True)
    # -1 and 0 mean off (vLLM / HF); anything above the vocabulary would keep every token anyway
    top_k = _int(body, "top_k", min(defaults.top_k, vocab_size or INT32_MAX), -1, min(vocab_size or INT32_MAX, INT32_MAX))
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise _bad("stop_token_ids", "must be a list of token ids")
    if len(stop_ids) > limits.max_stop_token_ids:
        raise _bad("stop_token_ids", f"at most {limits.max_stop_token_ids} ids, got {len(stop_ids)}")
    check_token_ids(stop_ids, vocab_size or INT32_MAX, "stop_token_ids")
    seed = _int(body, "seed", None, 0, SEED_MAX)
    # OpenAI's temperature 0 means greedy; sampling settings then do nothing, as with do_sample off
    try:
        return SamplingParams(max_new_tokens=max_tokens, do_sample=temperature > 0, temperature=temperature or 1.0,
                              top_k=max(top_k, 0), top_p=top_p, seed=seed, stop_token_ids=tuple(stop_ids),
                              ignore_eos=_bool(body, "ignore_eos"), logprobs=logprobs,
                              prompt_logprobs=prompt_logprobs)
    except ValueError as exc:  # SamplingParams' own rules (all checked above; a safety net, not a 500)
        field_name = str(exc).split(":")[0]
        raise APIError(400, str(exc), field_name) from None


def _stream(body: dict) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise _bad("stream_options", "is only allowed when stream is true")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise _bad("stream_options", "only {\"include_usage\": bool} is supported")
    return stream, _bool(options, "include_usage")


def parse_completion(body: dict, limits: ServerLimits, max_tokens_cap: int, vocab_size: int | None = None,
                     defaults: SamplingDefaults | None = None) -> Job:
    """A validated /v1/completions job; `vocab_size` bounds token ids and top_k (400 otherwise);
    `defaults` fill in the settings the request leaves out."""
    defaults = defaults or SamplingDefaults()
    _check_keys(body, _COMPLETION_KEYS)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = [_ids(p, "prompt") for p in prompt]
    else:
        raise _bad("prompt", "must be a string, a list of strings, a list of token ids or a list of such lists")
    if len(prompts) > limits.max_prompts:
        raise _bad("prompt", f"at most {limits.max_prompts} prompts per request, got {len(prompts)}")
    if vocab_size is not None:
        for p in prompts:
            if isinstance(p, list):
                check_token_ids(p, vocab_size, "prompt")
    n = _int(body, "n", 1, 1, limits.max_n)
    best_of = _int(body, "best_of", None, 1)
    if best_of is not None and best_of != n:
        raise _bad("best_of", f"must equal n (ranking by log-probability is not supported), got {_shown(best_of)}")
    echo = _bool(body, "echo")
    max_tokens = _int(body, "max_tokens", None, 0, max_tokens_cap)
    if max_tokens == 0 and not echo:
        raise _bad("max_tokens", "0 generates nothing: it is for scoring the prompt, with echo: true (and logprobs)")
    logprobs = _int(body, "logprobs", None, 0, MAX_LOGPROBS)
    stream, include_usage = _stream(body)
    # the real max_new_tokens is set once the prompt length is known (see app.py)
    params = _sampling(body, limits, max_tokens or 1, vocab_size, defaults, logprobs, logprobs if echo else None)
    return Job(False, prompts, params, n, stream, include_usage, _stop_strings(body, limits), echo, max_tokens,
               _user(body), logprobs)


def _user(body: dict) -> str | None:
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("user", f"must be a string, got {_shown(user)}")
    return user


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{index}].content", "only text parts ({\"type\": \"text\", \"text\": ...}) are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{index}].content", "must be a string or a list of text parts")


def parse_chat(body: dict, limits: ServerLimits, max_tokens_cap: int, vocab_size: int | None = None,
               defaults: SamplingDefaults | None = None) -> Job:
    """A validated /v1/chat/completions job (see parse_completion)."""
    defaults = defaults or SamplingDefaults()
    _check_keys(body, _CHAT_KEYS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of {\"role\", \"content\"} objects")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}]", "must be an object with a string role")
        extra = set(message) - {"role", "content"}
        if extra:
            raise _bad(f"messages[{i}].{sorted(extra)[0]}", "is not supported (text messages only)")
        role = "system" if message["role"] == "developer" else message["role"]  # OpenAI's newer name for it
        parsed.append({"role": role, "content": _content(message, i)})
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise _bad("response_format", "only {\"type\": \"text\"} is supported")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise _bad("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, key, None, 1, max_tokens_cap)
    n = _int(body, "n", 1, 1, limits.max_n)
    top_logprobs = _int(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    logprobs = (top_logprobs or 0) if _bool(body, "logprobs") else None
    if top_logprobs is not None and logprobs is None:
        raise _bad("top_logprobs", "needs logprobs: true")
    stream, include_usage = _stream(body)
    # the real max_new_tokens is set once the prompt length is known (see app.py)
    params = _sampling(body, limits, max_tokens or 1, vocab_size, defaults, logprobs)
    return Job(True, [parsed], params, n, stream, include_usage, _stop_strings(body, limits), False, max_tokens,
               _user(body), logprobs)
