"""Continuous-batching generation: a fixed number of slots, requests joining and leaving between steps.

    engine = InferenceEngine(model, max_slots=8, max_len=1024)
    results = engine.generate([[1, 5, 9], [1, 7]], SamplingParams(max_new_tokens=32))
    request = engine.submit(ids, params, on_update=callback)   # from any thread; engine.step() runs it

One engine step: requests that asked to stop leave; waiting requests take the free slots and are
prefilled (prompts padded to a length bucket, first token chosen in the same call; the requests
that share a bucket in one call, rows rounded up to a power of two, so a wave of clients pays one
launch sequence, not one each; a request asking for logprobs alone);
then ONE compiled decode call advances every occupied slot by a token at the slot's own position.
The call covers the slots up to the highest occupied one, rounded up to a power of two (requests
take the lowest free slots), so one request does not pay for a batch of idle slots. Per token,
the host sends those slots' last tokens and positions ([rows] int32 each, plus the sampling rows'
uniform draws) and receives [rows] token ids. Graph count is bounded: one prefill graph per prompt
bucket and one decode graph per (rows bucket, attention-length bucket) (x greedy / sampling),
compiled on first use in GRAPH_MODE and reused for the engine's life. In PyNative it runs eagerly
and synchronously (see generation.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from ..common.transformer import CausalLM
from ..generation import synchronous_pynative
from . import logprobs as lp
from .cache import DecodeView, PrefillView, SlotKVCache
from .sampling import SamplingParams, SlotSettings, TokenChooser
from .scheduler import Request, RequestError, Scheduler, length_buckets, pick_bucket
from .steps import DecodeStep, PrefillStep

log = logging.getLogger("mf_models")


class EngineFailure(RuntimeError):
    """The engine failed `max_consecutive_failures` steps in a row: it cannot serve any more."""


@dataclass
class EngineStats:
    """Counters since the engine was built (or `reset`)."""

    prefill_calls: int = 0            # compiled prefill calls (one per request asking for logprobs,
    prefilled: int = 0                # else one per prompt bucket and step) and the requests they seated
    prompt_tokens: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    first_call_seconds: float = 0.0   # first calls of new step Cells (in GRAPH_MODE: their compiles)
    graphs_built: int = 0
    failed_requests: int = 0          # ended with finish_reason "error" by a failing step

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of prefill and decode, the first call of every step Cell
        (where GRAPH_MODE compiles it) left out."""
        busy = self.prefill_seconds + self.decode_seconds
        return self.generated_tokens / busy if busy > 0 else 0.0

    def reset(self) -> None:
        graphs = self.graphs_built
        self.__init__()  # type: ignore[misc]
        self.graphs_built = graphs


class InferenceEngine:
    """Prefill + decode over a `SlotKVCache` of `max_slots` sequences of up to `max_len` tokens.

    - `max_len`: prompt + generated tokens per request (default: the model's
      max_position_embeddings, at most 2048). The cache holds max_slots x max_len positions.
    - `eos_token_ids`: stop ids of every request (default: the model config's eos_token_id);
      a request adds its own `stop_token_ids` and may set `ignore_eos`.
    - `min_prefill_bucket` / `min_decode_bucket`: smallest prompt / attention buckets; buckets
      double up to max_len.
    - `max_consecutive_failures`: a step that raises fails the requests it was running, and only
      them (a prefill call: the requests it seats; a decode step: every seated one); the engine
      goes on. When this many prefill calls, or this many decode steps, fail in a row, `step`
      raises `EngineFailure`: the engine cannot recover.
    """

    def __init__(self, model: CausalLM, *, max_slots: int = 8, max_len: int | None = None,
                 eos_token_ids: Sequence[int] | None = None, min_prefill_bucket: int = 16,
                 min_decode_bucket: int = 64, max_consecutive_failures: int = 3):
        limit = model.args.max_position_embeddings
        max_len = min(limit, 2048) if max_len is None else max_len
        for name, value in (("max_slots", max_slots), ("max_len", max_len), ("min_prefill_bucket", min_prefill_bucket),
                            ("min_decode_bucket", min_decode_bucket),
                            ("max_consecutive_failures", max_consecutive_failures)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"InferenceEngine: {name} must be a positive integer, got {value!r}")
        if max_len < 2:
            raise ValueError(f"InferenceEngine: max_len must be at least 2, got {max_len}")
        if max_len > limit:
            raise ValueError(f"InferenceEngine: max_len {max_len} exceeds the model's max_position_embeddings {limit}")
        self.model = model
        self.vocab_size = model.args.vocab_size
        self.max_slots, self.max_len = max_slots, max_len
        self.eos_token_ids = tuple(int(t) for t in (model.args.eos_token_ids if eos_token_ids is None else eos_token_ids))
        self.prefill_buckets = length_buckets(min(min_prefill_bucket, max_len), max_len)
        self.decode_buckets = length_buckets(min(min_decode_bucket, max_len), max_len)
        self.row_buckets = length_buckets(1, max_slots)   # slots a decode call covers: 1, 2, 4, .., max_slots
        self.cache = SlotKVCache.for_model(model, max_slots, max_len)
        self.scheduler = Scheduler(max_slots)
        self.settings = SlotSettings(max_slots)
        self.tokens = np.zeros(max_slots, np.int32)      # each slot's last token (next decode input)
        self.positions = np.zeros(max_slots, np.int32)   # ... and its position (= keys cached so far)
        self._choosers = {s: TokenChooser(self.vocab_size, s) for s in (False, True)}
        # steps that also return logprobs (logprobs.py), built only when a request asks for them
        self._logprob_choosers = {s: lp.LogprobChooser(self._choosers[s]) for s in (False, True)}
        self._prefill: dict[tuple, nn.Cell] = {}
        self._decode: dict[tuple, DecodeStep] = {}   # (rows, length bucket, sample, logprobs)
        self.stats = EngineStats()
        self.max_consecutive_failures = max_consecutive_failures
        self._failures_in_row = {"prefill": 0, "decode": 0}  # per kind of step: one may break alone
        log.info("inference engine: %d slots x %d positions, KV cache %.1f MB, prefill buckets %s, decode buckets %s",
                 max_slots, max_len, self.cache.nbytes() / 1e6, self.prefill_buckets, self.decode_buckets)

    # ---- requests ------------------------------------------------------------------------------
    def make_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                     on_update: Callable[[Request, list[int]], None] | None = None) -> Request:
        """A validated request (not yet queued). Raises `RequestError` with one line."""
        params = params or SamplingParams()
        try:
            ids = [int(t) for t in prompt_ids]
        except (TypeError, ValueError):
            raise RequestError("prompt token ids must be integers") from None
        if not ids:
            raise RequestError("the prompt is empty (at least one token is needed)")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if len(ids) + params.max_new_tokens > self.max_len:
            raise RequestError(f"prompt of {len(ids)} tokens + max_new_tokens {params.max_new_tokens} exceeds the "
                               f"engine's max length {self.max_len}")
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        return Request(ids, params, frozenset(stop), on_update)

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
               on_update: Callable[[Request, list[int]], None] | None = None) -> Request:
        """Queue a request (thread-safe); it joins a slot at the start of an engine step.
        `on_update(request, new_ids)` is called from the engine's thread after every token and
        once more when it finishes (new_ids empty if it ended without a new token)."""
        request = self.make_request(prompt_ids, params, on_update)
        self.scheduler.submit(request)
        return request

    def generate(self, prompts: Sequence[Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 on_update: Callable[[Request, list[int]], None] | None = None) -> list[Request]:
        """Run `prompts` to completion (at most max_slots at a time, the others joining as slots
        free up); returns the finished requests in prompt order. `on_update` as in `submit`."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(params)} sampling settings")
        requests = [self.make_request(p, s, on_update) for p, s in zip(prompts, params)]  # all checked first
        for request in requests:
            self.scheduler.submit(request)
        while not all(r.finished for r in requests):
            self.step()
        return requests

    # ---- the loop ------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.scheduler.active()) or self.scheduler.waiting > 0

    def step(self) -> None:
        """Drop cancelled requests, seat waiting ones (prefill), then one decode step for all."""
        with synchronous_pynative():
            for request in self.scheduler.take_cancelled_waiting():
                self._finish(request, request._cancel_reason or "cancelled", [])
            for request in self.scheduler.active():
                if request._cancel_reason is not None:
                    self._finish(request, request._cancel_reason, [])
            for group in self._prefill_groups(self.scheduler.admit()):
                try:
                    if len(group) == 1 and self._logprob_mode(group[0]):
                        self._prefill_one(group[0])
                    else:
                        self._prefill_together(group)
                except Exception as exc:  # the requests of this call only
                    self._failed(group, exc, "prefill")
                else:
                    self._failures_in_row["prefill"] = 0
            active = self.scheduler.active()
            if active:
                try:
                    self._decode_all(active)
                except Exception as exc:  # the batch it ran: every seated request
                    self._failed(active, exc, "decode")
                else:
                    self._failures_in_row["decode"] = 0

    def _failed(self, requests: list[Request], exc: Exception, what: str) -> None:
        """End `requests` with finish_reason "error" (their slots are freed and reset); raise
        EngineFailure once too many steps have failed in a row."""
        self._failures_in_row[what] += 1
        log.error("%s step failed (%s: %s); ending %d request(s) with finish_reason 'error'", what,
                  type(exc).__name__, exc, len(requests), exc_info=exc)
        for request in requests:
            if not request.finished:
                self.stats.failed_requests += 1
                self._finish(request, "error", [])
        if self._failures_in_row[what] >= self.max_consecutive_failures:
            raise EngineFailure(f"{self._failures_in_row[what]} {what} steps failed in a row, the last with "
                                f"{type(exc).__name__}: {exc}") from exc

    def run_forever(self, should_stop: Callable[[], bool], idle_wait: float = 0.05) -> None:
        """Serve submitted requests until `should_stop()` (for a server's engine thread)."""
        while not should_stop():
            if self.scheduler.wait_for_work(idle_wait):
                self.step()

    def abort_all(self, reason: str = "error") -> None:
        """Finish every active and waiting request with `reason` (after an engine failure)."""
        for request in self.scheduler.active() + self.scheduler.take_all_waiting():
            self._finish(request, request._cancel_reason or reason, [])

    def warmup(self) -> None:
        """Compile the smallest prefill and decode graphs (greedy) before the first request."""
        self.generate([[0]], SamplingParams(max_new_tokens=2, ignore_eos=True))
        self.stats.reset()

    # ---- compiled steps ------------------------------------------------------------------------
    def _prefill_step(self, bucket: int, sample: bool, logprobs: str = "", rows: int = 1) -> nn.Cell:
        """logprobs "": plain; "token": the first token's logprobs too; "prompt": the prompt scored
        (those two: one request a call)."""
        step = self._prefill.get((bucket, sample, logprobs, rows))
        if step is None:
            view = PrefillView(self.cache, bucket, rows)
            if logprobs == "prompt":
                step = lp.ScoringPrefillStep(self.model, view, self._logprob_choosers[sample])
            else:
                step = PrefillStep(self.model, view, (self._logprob_choosers if logprobs else self._choosers)[sample])
            self._prefill[(bucket, sample, logprobs, rows)] = step
            self.stats.graphs_built += 1
        return step

    def _decode_step(self, rows: int, bucket: int, sample: bool, logprobs: bool = False) -> DecodeStep:
        step = self._decode.get((rows, bucket, sample, logprobs))
        if step is None:
            chooser = (self._logprob_choosers if logprobs else self._choosers)[sample]
            step = DecodeStep(self.model, DecodeView(self.cache, bucket, rows), chooser)
            self._decode[(rows, bucket, sample, logprobs)] = step
            self.stats.graphs_built += 1
        return step

    @staticmethod
    def _logprob_mode(request: Request) -> str:
        params = request.params
        return "prompt" if params.prompt_logprobs is not None else "token" if params.logprobs is not None else ""

    def _prefill_groups(self, seated: list[Request]) -> list[list[Request]]:
        """The newly seated requests as prefill calls: those asking for logprobs one by one, the
        others together per prompt bucket (in seating order)."""
        groups: dict[object, list[Request]] = {}
        for request in seated:
            if self._logprob_mode(request):
                groups[request.id] = [request]
            else:
                groups.setdefault(pick_bucket(self.prefill_buckets, len(request.prompt_ids)), []).append(request)
        return list(groups.values())

    def _prefill_together(self, requests: list[Request]) -> None:
        """One prefill call for requests of one prompt bucket: rows rounded up to a power of two,
        the extra rows repeating the first request (the same rows written with the same values)."""
        started = time.perf_counter()
        lengths = [len(r.prompt_ids) for r in requests]
        bucket = pick_bucket(self.prefill_buckets, max(lengths))
        rows = pick_bucket(self.row_buckets, len(requests))
        padded = requests + [requests[0]] * (rows - len(requests))
        ids = np.zeros((rows, bucket), np.int32)
        for row, request in enumerate(padded):
            ids[row, :len(request.prompt_ids)] = request.prompt_ids
        slots = [r.slot for r in padded]
        sample = any(r.params.do_sample for r in requests)
        for request in requests:
            self.settings.set(request.slot, request.params)
            if request.params.do_sample:
                self.settings.uniform[request.slot] = request.rng.random()
        built = self.stats.graphs_built
        out = self._prefill_step(bucket, sample, "", rows)(
            Tensor(ids), Tensor(np.array(slots, np.int32)), Tensor(np.array([len(r.prompt_ids) - 1 for r in padded],
                                                                            np.int32)),
            *self.settings.tensors(slots)).asnumpy()
        self.stats.prefill_calls += 1
        self.stats.prefilled += len(requests)
        self.stats.prompt_tokens += sum(lengths)
        self._time("prefill_seconds", started, built)
        for row, request in enumerate(requests):
            self.positions[request.slot] = lengths[row]
            self._accept(request, int(out[row]))

    def _prefill_one(self, request: Request) -> None:
        """One request's prefill with its logprobs (the first token's, and the prompt's when asked)."""
        started = time.perf_counter()
        slot, length = request.slot, len(request.prompt_ids)
        bucket = pick_bucket(self.prefill_buckets, length)
        ids = np.zeros((1, bucket), np.int32)
        ids[0, :length] = request.prompt_ids
        sample = request.params.do_sample
        self.settings.set(slot, request.params)
        if sample:
            self.settings.uniform[slot] = request.rng.random()
        built = self.stats.graphs_built
        params, entry = request.params, None
        mode = "prompt" if params.prompt_logprobs is not None else "token" if params.logprobs is not None else ""
        inputs = [Tensor(ids), Tensor([slot], ms.int32), Tensor([length - 1], ms.int32), *self.settings.tensors([slot])]
        if mode == "prompt":  # the targets: each position's next prompt token
            inputs.insert(1, Tensor(np.append(ids[0, 1:], 0).astype(np.int32)))
        out = self._prefill_step(bucket, sample, mode)(*inputs)
        if mode:
            out = [o.asnumpy() for o in out]
            token = out[0][0]
            entry = lp.entry(token, out[1][0], out[2][0], out[3][0], params.logprobs or 0)
            if mode == "prompt":
                request.prompt_logprobs = lp.prompt_entries(request.prompt_ids, *out[4:], params.prompt_logprobs)
        else:
            token = out.asnumpy()[0]
        self.stats.prefill_calls += 1
        self.stats.prefilled += 1
        self.stats.prompt_tokens += length
        self._time("prefill_seconds", started, built)
        self.positions[slot] = length
        self._accept(request, int(token), entry if params.logprobs is not None else None)

    def _decode_all(self, active: list[Request]) -> None:
        started = time.perf_counter()
        view = pick_bucket(self.decode_buckets, int(max(self.positions[r.slot] for r in active)) + 1)
        rows = pick_bucket(self.row_buckets, max(r.slot for r in active) + 1)
        sample = False
        for request in active:
            if request.params.do_sample:
                sample = True
                self.settings.uniform[request.slot] = request.rng.random()
        built = self.stats.graphs_built
        logprobs = any(r.params.logprobs is not None for r in active)
        out = self._decode_step(rows, view, sample, logprobs)(Tensor(self.tokens[:rows]), Tensor(self.positions[:rows]),
                                                               *self.settings.tensors(slice(rows)))
        out = [o.asnumpy() for o in out] if logprobs else [out.asnumpy()]
        self.stats.decode_steps += 1
        self._time("decode_seconds", started, built)
        for request in active:
            self.positions[request.slot] += 1
            row = request.slot
            entry = None if request.params.logprobs is None else \
                lp.entry(out[0][row], out[1][row], out[2][row], out[3][row], request.params.logprobs)
            self._accept(request, int(out[0][row]), entry)

    def _time(self, field: str, started: float, graphs_before: int) -> None:
        elapsed = time.perf_counter() - started
        if self.stats.graphs_built > graphs_before:  # a new step Cell: its first call compiles it
            self.stats.first_call_seconds += elapsed
        else:
            setattr(self.stats, field, getattr(self.stats, field) + elapsed)

    def _accept(self, request: Request, token: int, logprob: lp.TokenLogprob | None = None) -> None:
        self.stats.generated_tokens += 1
        if request.first_token_at is None:
            request.first_token_at = time.perf_counter()
        if token in request.stop_ids:
            request.stop_token = token
            self._finish(request, "stop", [])
            return
        request.output_ids.append(token)
        if logprob is not None:
            request.output_logprobs.append(logprob)
        self.tokens[request.slot] = token
        if len(request.output_ids) >= request.params.max_new_tokens:
            self._finish(request, "length", [token])
        else:
            self._notify(request, [token])

    def _finish(self, request: Request, reason: str, new_ids: list[int]) -> None:
        request.finish_reason = reason
        request.finished_at = time.perf_counter()
        if request.slot is not None:
            self.tokens[request.slot] = 0
            self.positions[request.slot] = 0
            self.settings.clear(request.slot)
            self.scheduler.release(request)
        self._notify(request, new_ids)
        request.done.set()

    def _notify(self, request: Request, new_ids: list[int]) -> None:
        if request.on_update is None:
            return
        try:
            request.on_update(request, new_ids)
        except Exception:  # a consumer's failure ends its own request, never the engine
            log.exception("on_update of request %d failed; cancelling it", request.id)
            request.cancel("cancelled")
