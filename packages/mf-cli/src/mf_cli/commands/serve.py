"""`mf serve CHECKPOINT|HF_DIR|CONFIG [--host 127.0.0.1] [--port 8000]`: an OpenAI-compatible server.

The model and tokenizer load as for `mf generate` (a CONFIG must be a `run_mode: predict` YAML;
its `inference` section is not used here: every request brings its own settings). Endpoints,
limits and error shapes are mf_models.serving's (see its README): /v1/completions,
/v1/chat/completions (chat rendered by mf-data's ChatEncoder, as SFT data is), streaming via
server-sent events, /v1/models, /health, /metrics (Prometheus). Requests share the engine's slots
by continuous batching. The model id defaults to the run's name (`tiny` for
output/tiny/checkpoint); settings a request leaves out (temperature, top_p, top_k, max_tokens)
follow the model's generation config, and its EOS ids are the stop ids.

Once the warm-up compile is done, one line `mf serve: listening on http://HOST:PORT` goes to
stdout (`--port 0` picks a free port). SIGINT/SIGTERM stop it after in-flight requests finish.
Exit 2 for bad input (a bad source, a port that cannot be bound), 1 if the server fails.
"""

from __future__ import annotations

import os
import socket
import sys

from mf_cli.errors import UsageError


def add_parser(subparsers, name: str, help_text: str) -> None:
    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument("source", metavar="CHECKPOINT|HF_DIR|CONFIG", help="mf checkpoint, HF directory or predict YAML")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    p.add_argument("--model-name", help="the model id clients use (default: the checkpoint's directory name, or "
                                        "for a generic one such as 'checkpoint' the run's name)")
    p.add_argument("--tokenizer", metavar="PATH", help="sentencepiece .model or HF tokenizer directory")
    p.add_argument("--max-slots", type=int, default=8, help="requests decoded together (default 8)")
    p.add_argument("--max-len", type=int, help="prompt + completion tokens per request "
                                               "(default: max_position_embeddings, at most 2048)")
    p.add_argument("--max-tokens", type=int, default=1024, help="largest max_tokens a request may ask (default 1024)")
    p.add_argument("--max-request-bytes", type=int, default=1_000_000, help="largest request body (default 1 MB)")
    p.add_argument("--max-waiting", type=int, default=256, help="queued requests before 503 (default 256)")
    p.add_argument("--mode", choices=("graph", "pynative"), help="MindSpore mode (default graph)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a CONFIG key (repeatable)")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                   help="server log level (default warning; info logs every request)")
    p.set_defaults(run=run)


def _check(args) -> None:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port: must be in 0..65535, got {args.port}")
    for flag in ("max_slots", "max_tokens", "max_request_bytes", "max_waiting"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')}: must be positive, got {getattr(args, flag)}")
    if args.max_len is not None and args.max_len < 2:
        raise UsageError(f"--max-len: must be at least 2, got {args.max_len}")


def run(args) -> int:
    os.environ.setdefault("GLOG_v", "3")
    _check(args)
    import logging

    logging.basicConfig(level=args.log_level.upper(), format="[%(name)s] %(message)s", stream=sys.stderr)
    # Requests bring their own prompts and settings: a predict YAML's inference section is not used,
    # so its prompt requirement is met with a placeholder.
    unused = ['inference.prompts=["-"]', "inference.input_file=null"] if os.path.isfile(args.source) else []
    if not os.path.exists(args.source):  # before importing MindSpore: bad input answers in a blink
        raise UsageError(f"{args.source}: no such file or directory")
    sock = _bind(args.host, args.port)   # before loading anything: a taken port fails at once
    try:
        return _serve(args, sock, unused)
    finally:
        sock.close()


def _bind(host: str, port: int) -> socket.socket:
    """`mf_models.serving.bind`'s twin, on purpose: importing mf_models loads MindSpore (seconds),
    and a taken port must fail before that, with a usage error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"--host/--port: cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    return sock


def _serve(args, sock, unused: list[str]) -> int:
    from mf_cli.commands.generate import load_source
    from mf_models.inference import InferenceEngine
    from mf_models.serving import SamplingDefaults, ServerLimits, serve

    source = load_source(args.source, tokenizer=args.tokenizer, overrides=args.overrides, mode=args.mode,
                         predict_overrides=unused, command="serve")
    for note in source.notes:
        print(f"mf serve: note: {note}", file=sys.stderr)
    try:
        defaults = SamplingDefaults.from_generation_config(source.generation_config,
                                                           "the model's generation config")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        engine = InferenceEngine(source.model, max_slots=args.max_slots, max_len=args.max_len,
                                 eos_token_ids=source.eos_token_ids)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    limits = ServerLimits(max_request_bytes=args.max_request_bytes, max_tokens=args.max_tokens,
                          max_waiting=args.max_waiting)

    def ready(url: str) -> None:
        tokenizer = source.tokenizer.path if source.tokenizer else "none (token-id prompts only)"
        print(f"mf serve: model {args.model_name or source.name}, {args.max_slots} slots x {engine.max_len} "
              f"tokens, tokenizer {tokenizer}; request defaults: {defaults.describe()}", file=sys.stderr)
        print(f"mf serve: listening on {url}", flush=True)

    try:
        serve(engine, tokenizer=source.tokenizer, model_name=args.model_name or source.name, sock=sock,
              limits=limits, on_ready=ready, log_level=args.log_level, defaults=defaults)
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"mf serve: failed: {message}", file=sys.stderr)
        return 1
    return 0
