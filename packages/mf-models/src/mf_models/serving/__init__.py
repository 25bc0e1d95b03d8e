"""OpenAI-compatible HTTP serving of an `InferenceEngine` (the `serve` extra: starlette, uvicorn,
prometheus_client for `/metrics`).

    from mf_models.serving import serve
    serve(engine, tokenizer=my_tokenizer, model_name="tiny", host="127.0.0.1", port=8000)

`tokenizer` is any object with `encode(text)`, `decode(ids)` and `encode_chat(messages)` (see
`ServingTokenizer`); mf-models has no tokenizer of its own (mf-cli passes mf-data's).
"""

from .app import ServingTokenizer, create_app
from .metrics import ServerMetrics
from .protocol import APIError, SamplingDefaults, ServerLimits
from .runner import EngineRunner, TokenStream
from .server import bind, serve
from .tokenization import TextEncoder

__all__ = ["APIError", "EngineRunner", "SamplingDefaults", "ServerLimits", "ServerMetrics", "ServingTokenizer",
           "TextEncoder", "TokenStream", "bind", "create_app", "serve"]
