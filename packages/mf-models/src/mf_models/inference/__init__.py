"""Batched generation with continuous batching over the mf models.

    from mf_models.inference import InferenceEngine, SamplingParams
    engine = InferenceEngine(model, max_slots=8, max_len=1024)
    done = engine.generate([[1, 5, 9], [1, 7]], SamplingParams(max_new_tokens=32, do_sample=True, top_p=0.9, seed=0))
    done[0].output_ids, done[0].finish_reason, engine.stats.tokens_per_second
"""

from .cache import DecodeView, PrefillView, SlotKVCache
from .engine import EngineFailure, EngineStats, InferenceEngine
from .loading import Pretrained, find_tokenizer, load_pretrained, load_weights, model_name, read_checkpoint_info
from .logprobs import MAX_LOGPROBS, TokenLogprob
from .sampling import SamplingParams, TokenChooser
from .scheduler import Request, RequestError
from .scoring import Scored, Scorer
from .text import TextStream

__all__ = [
    "DecodeView", "EngineFailure", "EngineStats", "InferenceEngine", "MAX_LOGPROBS", "PrefillView", "Pretrained",
    "Request", "RequestError", "SamplingParams", "Scored", "Scorer", "SlotKVCache", "TextStream", "TokenChooser",
    "TokenLogprob", "find_tokenizer", "load_pretrained", "load_weights",
    "model_name", "read_checkpoint_info",
]
