"""mf's model as an lm-evaluation-harness language model (`lm_eval.api.model.TemplateLM`), for
`mf eval CONFIG --tasks ...` (lm-eval is the `eval` extra: `pip install "mf-cli[eval]"`).

- Text is tokenised as `mf serve` tokenises it (mf_models.serving.TextEncoder: the tokenizer's
  special-token strings are their tokens), and lm-eval splits context and continuation itself
  (`TemplateLM._encode_pair`), so the requests equal those its `local-completions` model sends to
  `mf serve`.
- `loglikelihood` (and `multiple_choice` tasks): batched teacher-forced forwards
  (mf_models.inference.Scorer): the sum of the continuation's token log-probabilities and whether
  each was the most likely token. A sequence longer than the context keeps its end.
- `loglikelihood_rolling` (perplexity tasks): lm-eval's own disjoint rolling windows of the
  context length, the first one after the prefix token (BOS, else EOS), as its Hugging Face model
  does.
- `generate_until`: the inference engine (continuous batching over `batch_size` slots); greedy
  unless the task asks for sampling (`do_sample`, `temperature` > 0, with `top_p` / `top_k`);
  generation stops at the task's `until` strings and the EOS text, at `max_gen_toks` tokens, or
  at EOS. Any other generation setting is refused (exit 2) rather than ignored.
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.model import TemplateLM
from tqdm import tqdm

from mf_cli.errors import UsageError

GENERATION_KEYS = {"until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k"}


class MFLM(TemplateLM):
    """`model` (an mf CausalLM, weights loaded) with `tokenizer` (mf-cli's TokenizerAdapter)."""

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 8, max_length: int | None = None,
                 max_gen_toks: int = 256, name: str = "mf"):
        super().__init__()
        from mf_models.inference import Scorer
        from mf_models.serving import TextEncoder

        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.text = TextEncoder(tokenizer)
        limit = model.args.max_position_embeddings
        self.max_length = min(limit, max_length or limit)
        self.batch_size = batch_size
        self.max_gen_toks = max_gen_toks
        self.scorer = Scorer(model, batch_size=batch_size, max_len=self.max_length)
        self._engine = None

    # ---- tokenizer ----------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise UsageError("the tokenizer has no EOS token, which lm-eval needs (the end of a document)")
        return eos

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "path", "mf"))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.text.encode(string)   # mf's tokenizers add no BOS / EOS to a text

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.tokenizer.decode(list(tokens))

    # ---- scoring ------------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        items = [(context + continuation, len(continuation)) for _, context, continuation in requests]
        with tqdm(total=len(items), desc="mf: scoring", disable=disable_tqdm) as bar:
            scored = self.scorer.score(items, bar.update)
        results = [(s.total, s.greedy) for s in scored]
        for (key, _, _), result in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows, owners = [], []
        for index, (string,) in enumerate(req.args for req in requests):
            for window in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, *window))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (total, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
            totals[owner] += total
        for (string,), total in zip((req.args for req in requests), totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return totals

    # ---- generation ---------------------------------------------------------------------------
    def _params(self, kwargs: dict) -> tuple[Any, list[str]]:
        from mf_models.inference import SamplingParams

        kwargs = dict(kwargs)
        unknown = sorted(set(kwargs) - GENERATION_KEYS)
        if unknown:
            raise UsageError(f"generation setting {unknown[0]!r} of the task is not supported by mf eval "
                             f"(supported: {', '.join(sorted(GENERATION_KEYS))})")
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        eos_text = self.tokenizer.decode([self.eot_token_id])
        if eos_text and eos_text not in until:
            until.append(eos_text)
        temperature = float(kwargs.get("temperature", 0.0) or 0.0)
        sample = bool(kwargs.get("do_sample", False)) or temperature > 0
        params = SamplingParams(max_new_tokens=int(kwargs.get("max_gen_toks", self.max_gen_toks)), do_sample=sample,
                                temperature=temperature if sample and temperature > 0 else 1.0,
                                top_p=float(kwargs.get("top_p", 1.0) or 1.0), top_k=int(kwargs.get("top_k", 0) or 0))
        return params, until

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from mf_models.inference import InferenceEngine, TextStream

        if self._engine is None:
            self._engine = InferenceEngine(self.model, max_slots=self.batch_size, max_len=self.max_length)
        prompts, settings, streams = [], [], []
        for context, kwargs in (req.args for req in requests):
            params, until = self._params(kwargs)
            if params.max_new_tokens >= self.max_length:
                raise UsageError(f"max_gen_toks {params.max_new_tokens} leaves no room for a prompt in the "
                                 f"context of {self.max_length} tokens")
            ids = self.tok_encode(context)[-(self.max_length - params.max_new_tokens):] or [self.prefix_token_id]
            prompts.append(ids)
            settings.append(params)
            streams.append(TextStream(self.tokenizer.decode, until, ids))
        index = {}
        bar = tqdm(total=len(prompts), desc="mf: generating", disable=disable_tqdm)

        def update(request, new_ids):
            stream = streams[index[request.id]]
            stream.push(new_ids)
            if stream.stopped and not request.finished:
                request.cancel("stop")
            if request.finished:
                bar.update(1)

        requests_ = []
        for i, (ids, params) in enumerate(zip(prompts, settings)):  # updates come from step() only, below
            requests_.append(self._engine.submit(ids, params, update))
            index[requests_[-1].id] = i
        while not all(r.finished for r in requests_):
            self._engine.step()
        bar.close()
        out = []
        for (context, kwargs), stream in zip((req.args for req in requests), streams):
            stream.finish()
            out.append(stream.text)
            self.cache_hook.add_partial("generate_until", (context, kwargs), stream.text)
        return out
