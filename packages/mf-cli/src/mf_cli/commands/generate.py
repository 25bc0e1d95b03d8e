"""`mf generate SOURCE ...`: batched generation with continuous batching (mf_models.inference).

SOURCE is one of
  - a YAML config with `run_mode: predict`: the model section, weights from `checkpoint.load_path`,
    `tokenizer.path`, and the `inference` section (max_new_tokens, do_sample, temperature, top_k,
    top_p, stop_token_ids, batch_size = engine slots, prompts / input_file, output_file);
    `training.seed` seeds sampling. Command-line flags override these keys (as `--set` does).
  - a training YAML (`run_mode: train | finetune`): the same, with the weights its run produced
    (the last checkpoint in `checkpoint.save_path`: a fine-tune's fine-tuned weights) unless
    `--weights PATH` (or `--set checkpoint.load_path=...`) names others; stderr says which.
  - an mf checkpoint (save directory or iteration directory) written by mf-trainer: the model
    comes from its common.json (`hf_config`), the tokenizer from the files it carries
    (`iteration_N/tokenizer/`; older checkpoints: the training config's tokenizer.path), so a copied
    checkpoint needs no --tokenizer.
  - a Hugging Face directory (config.json + safetensors; tokenizer.json / tokenizer.model beside).
The stored tensors' shapes are checked against the model config before the model is built.

Prompts: `--prompt TEXT` and `--prompt-ids 1,2,3` (repeatable, in order) or `--input FILE.jsonl`
with one {"prompt": text} or {"prompt_ids": [...]} object per line (an "id" key is copied to the
output). Results go to stdout, or to `--output FILE.jsonl` (prompt, prompt_ids, completion,
completion_ids, prompt_tokens, completion_tokens, finish_reason), written atomically; the token
counts and tokens/s go to stderr. Exit 0 done, 2 bad input (one line), 1 failure while generating.
`mf serve` shares the model and tokenizer loading below.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mf_cli.errors import UsageError


# ---- shared with `mf serve` -------------------------------------------------------------------
class TokenizerAdapter:
    """mf-data's tokenizer behind the interface mf_models.serving needs (encode, decode,
    encode_chat). Chat prompts are rendered by mf-data's ChatEncoder, i.e. exactly as SFT data
    is tokenised: the tokenizer's chat template, or mf-data's built-in template without one."""

    def __init__(self, path: str):
        import mf_data

        self.path = path
        self._tok = mf_data.load_tokenizer(path)
        self._chat = None

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self._tok.eod

    @property
    def bos_token_id(self) -> int | None:
        return self._tok.bos

    @property
    def special_tokens(self) -> dict[str, str | None]:
        return dict(self._tok.special_tokens)

    def token_to_id(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

    @property
    def chat_template(self) -> str | None:
        return self._tok.chat_template

    @property
    def tokenizer_class(self) -> str:
        return type(self._tok).__name__

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode([text])[0])

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        import mf_data

        if self._chat is None:
            self._chat = mf_data.ChatEncoder(self._tok)  # ValueError subclasses for bad input
        return self._chat.encode_prompt(messages)


@dataclass
class Source:
    model: Any
    name: str
    eos_token_ids: list[int]
    tokenizer: TokenizerAdapter | None
    inference: Any = None          # mf_config.InferenceConfig (CONFIG sources)
    seed: int | None = None        # training.seed (CONFIG sources)
    notes: list[str] = field(default_factory=list)
    generation_config: dict = field(default_factory=dict)  # the checkpoint's (HF generation_config.json names)


def bad_input_errors() -> tuple[type[BaseException], ...]:
    import mf_ckpt
    import mf_config
    import mf_data
    import mf_models

    return (mf_config.ConfigError, mf_models.ModelConfigError, mf_models.ModelStateError, mf_data.MFDataError,
            mf_ckpt.CheckpointError)


def set_mode(mode: str | int | None, device_target: str | None = None) -> None:
    import mindspore as ms

    context: dict[str, Any] = {"mode": ms.PYNATIVE_MODE if mode in ("pynative", 1) else ms.GRAPH_MODE}
    if device_target:
        context["device_target"] = device_target
    ms.set_context(**context)


def is_graph_mode() -> bool:
    import mindspore as ms

    return ms.get_context("mode") == ms.GRAPH_MODE


def _tokenizer(path: str | None) -> TokenizerAdapter | None:
    return TokenizerAdapter(path) if path else None


def load_source(path: str, *, tokenizer: str | None = None, overrides: list[str] = (), mode: str | None = None,
                predict_overrides: list[str] = (), command: str = "generate", weights: str | None = None) -> Source:
    """Model, tokenizer and defaults of SOURCE; bad input raises UsageError (one line). `weights`:
    the weights the command line names for a YAML (a training YAML's default: its run's own)."""
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or directory")
    bad = bad_input_errors()
    try:
        if os.path.isdir(path):
            if overrides:
                raise UsageError("--set applies to a YAML config, not to a checkpoint directory")
            if weights:
                raise UsageError("--weights applies to a YAML config; a checkpoint directory is its own weights")
            set_mode(mode or "graph")
            from mf_models.inference import load_pretrained

            loaded = load_pretrained(path, tokenizer=tokenizer)
            tok = _tokenizer(loaded.tokenizer_path)
            eos = loaded.eos_token_ids or ([tok.eos_token_id] if tok and tok.eos_token_id is not None else [])
            return Source(loaded.model, loaded.name, eos, tok, notes=loaded.notes,
                          generation_config=loaded.generation_config)
        return _load_config_source(path, tokenizer, [*predict_overrides, *overrides], mode, command, weights)
    except bad as exc:
        raise UsageError(str(exc).strip().splitlines()[0]) from None


def _load_config_source(path: str, tokenizer: str | None, overrides: list[str], mode: str | None,
                        command: str = "generate", weights: str | None = None) -> Source:
    import mf_config
    import mf_models

    if tokenizer:
        overrides = [*overrides, f"tokenizer.path={json.dumps(tokenizer)}",
                     f"tokenizer.type={'hf' if os.path.isdir(tokenizer) else 'sentencepiece'}"]
    from mf_cli.checks import check, completed
    from mf_trainer.sources import weights_for_inference

    notes: list[str] = []
    cfg = completed(mf_config.load_config(path, overrides=overrides), notes)
    if command == "generate":
        cfg, note = weights_for_inference(cfg, weights)
        notes += [note] if note else []
    check(cfg, command, 1, cfg.context.device_target, source=path)   # one process
    load_path = cfg.checkpoint.load_path
    kind = "hf" if os.path.isdir(cfg.tokenizer.path) else "sentencepiece"
    if cfg.tokenizer.path and os.path.exists(cfg.tokenizer.path) and kind != cfg.tokenizer.type:
        raise UsageError(f"tokenizer.type: {cfg.tokenizer.type!r}, but {cfg.tokenizer.path} is a "
                         f"{'directory (hf)' if kind == 'hf' else 'file (sentencepiece)'}")
    set_mode(mode if mode is not None else cfg.context.mode, cfg.context.device_target)
    section = {"model_type": cfg.model.model_type, **cfg.model.extra}
    if cfg.model.architectures:
        section["architectures"] = cfg.model.architectures
    from mf_models.inference import find_tokenizer, read_checkpoint_info

    _, _, common = read_checkpoint_info(load_path)
    mf_models.check_weights_fit(section, load_path)   # before the model is built from the section
    model = mf_models.build_model(section, init=False)
    mf_models.load_weights(model, load_path)
    tok = _tokenizer(cfg.tokenizer.path or find_tokenizer(load_path, common, notes))
    generation = common.get("hf_generation_config") if isinstance(common.get("hf_generation_config"), dict) else {}
    eos = model.args.eos_token_ids or ([tok.eos_token_id] if tok and tok.eos_token_id is not None else [])
    name = os.path.splitext(os.path.basename(path))[0]   # a predict YAML: its own name is the model id
    return Source(model, name, eos, tok, inference=cfg.inference, seed=cfg.training.seed,
                  notes=notes, generation_config=dict(generation))


# ---- mf generate ------------------------------------------------------------------------------
def _ids_arg(text: str) -> tuple[str, list[int]]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas or spaces, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("no token ids")
    return ("ids", ids)


def add_parser(subparsers, name: str, help_text: str) -> None:
    p = subparsers.add_parser(name, help=help_text, description=help_text)
    p.add_argument("source", metavar="CONFIG|CHECKPOINT|HF_DIR", help="predict YAML, mf checkpoint or HF directory")
    p.add_argument("--prompt", dest="inputs", action="append", type=lambda t: ("text", t), default=[],
                   metavar="TEXT", help="a prompt (repeatable)")
    p.add_argument("--prompt-ids", dest="inputs", action="append", type=_ids_arg, metavar="IDS",
                   help="a prompt as token ids, e.g. 1,2,3 (repeatable)")
    p.add_argument("--input", metavar="FILE", help="JSON Lines of {\"prompt\": ...} or {\"prompt_ids\": [...]}")
    p.add_argument("--output", metavar="FILE", help="write JSON Lines here instead of printing")
    p.add_argument("--force", action="store_true", help="replace an existing --output file (never an input)")
    p.add_argument("--max-new-tokens", type=int, metavar="N")
    p.add_argument("--do-sample", action="store_true", default=None, help="sample (default: greedy)")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, help="sampling seed (prompt i uses seed + i)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--stop-token-id", dest="stop_ids", action="append", type=int, metavar="ID",
                   help="stop token id (repeatable; added to the EOS ids)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's EOS ids")
    p.add_argument("--tokenizer", metavar="PATH", help="sentencepiece .model or HF tokenizer directory")
    p.add_argument("--batch-size", type=int, metavar="N", help="engine slots: prompts generated at once")
    p.add_argument("--mode", choices=("graph", "pynative"), help="MindSpore mode (default graph; a CONFIG's context.mode)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a CONFIG key (repeatable)")
    p.add_argument("--dry-run", action="store_true",
                   help="check a predict CONFIG (schema, rules, the preflight of mf generate) and print what would run; "
                        "loads no model, writes nothing")
    p.add_argument("--weights", metavar="PATH",
                   help="with a CONFIG: generate with these weights (default: a training YAML's save_path checkpoint)")
    p.set_defaults(run=run)


def _read_jsonl(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):   # RecursionError: a line nested deeper than the parser goes
            raise UsageError(f"{path}:{number}: not a JSON object") from None
        if not isinstance(item, dict) or set(item) - {"prompt", "prompt_ids", "id"} or \
                ("prompt" in item) == ("prompt_ids" in item):
            raise UsageError(f"{path}:{number}: expected {{\"prompt\": text}} or {{\"prompt_ids\": [ids]}} "
                             "(plus an optional \"id\")")
        if "prompt" in item and not (isinstance(item["prompt"], str) and item["prompt"]):
            raise UsageError(f"{path}:{number}: prompt must be a non-empty string")
        ids = item.get("prompt_ids")
        if "prompt_ids" in item and not (isinstance(ids, list) and ids and
                                         all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise UsageError(f"{path}:{number}: prompt_ids must be a non-empty list of integers")
        items.append(item)
    if not items:
        raise UsageError(f"{path}: no prompts")
    return items


def _config_overrides(args) -> list[str]:
    """CLI flags as `inference.*` overrides of a CONFIG (validated by mf-config like the file)."""
    out = []
    texts = [v for kind, v in args.inputs if kind == "text"]
    if any(kind == "ids" for kind, _ in args.inputs):
        raise UsageError("--prompt-ids: with a CONFIG give text prompts, or token ids through --input FILE.jsonl")
    if texts:
        out += [f"inference.prompts={json.dumps(texts)}", "inference.input_file=null"]
    if args.input:
        out += [f"inference.input_file={json.dumps(args.input)}", "inference.prompts=null"]
    for flag, key in (("max_new_tokens", "max_new_tokens"), ("do_sample", "do_sample"), ("temperature", "temperature"),
                      ("top_k", "top_k"), ("top_p", "top_p"), ("batch_size", "batch_size")):
        value = getattr(args, flag)
        if value is not None:
            out.append(f"inference.{key}={json.dumps(value)}")
    if args.stop_ids:
        out.append(f"inference.stop_token_ids={json.dumps(args.stop_ids)}")
    if args.output:
        out.append(f"inference.output_file={json.dumps(args.output)}")
    if args.seed is not None:
        out.append(f"training.seed={args.seed}")
    return out


def _prompts(args, source: Source) -> list[dict]:
    if source.inference is not None:
        inf = source.inference
        return _read_jsonl(inf.input_file) if inf.input_file else [{"prompt": p} for p in inf.prompts or []]
    items = [{"prompt": v} if kind == "text" else {"prompt_ids": v} for kind, v in args.inputs]
    if args.input:
        if items:
            raise UsageError("give --prompt/--prompt-ids or --input, not both")
        items = _read_jsonl(args.input)
    if not items:
        raise UsageError("no prompts: give --prompt, --prompt-ids or --input")
    return items


def _explicit_max_new_tokens(args) -> bool:
    """Whether the command line or the YAML itself names inference.max_new_tokens (the schema's
    default of 128 does not count: a training YAML has no inference section of its own)."""
    if args.max_new_tokens is not None:
        return True
    if any(o.split("=", 1)[0].strip() == "inference.max_new_tokens" for o in args.overrides):
        return True
    import yaml

    try:
        with open(args.source, encoding="utf-8") as f:
            raw = yaml.safe_load(f)       # already loaded and validated by mf-config: it parses
    except (OSError, ValueError, yaml.YAMLError):
        return True
    inference = raw.get("inference") if isinstance(raw, dict) else None
    return isinstance(inference, dict) and inference.get("max_new_tokens") is not None


def _generation_default(generation_config: dict) -> int | None:
    """The checkpoint's own max_new_tokens (its generation_config), when it records a usable one."""
    value = (generation_config or {}).get("max_new_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _sampling_settings(args, source: Source) -> dict[str, Any]:
    """Explicit settings win; without a max_new_tokens the checkpoint's generation config gives it
    (else 128), fitted to the positions the prompt leaves (see _generate)."""
    inf = source.inference
    default = _generation_default(source.generation_config)
    if inf is not None:  # CLI flags already went into the config as overrides
        return {"max_new_tokens": inf.max_new_tokens if _explicit_max_new_tokens(args) else None,
                "default_max_new_tokens": default, "do_sample": inf.do_sample, "temperature": inf.temperature,
                "top_k": inf.top_k, "top_p": inf.top_p, "stop_token_ids": tuple(inf.stop_token_ids or ()),
                "slots": inf.batch_size, "seed": source.seed, "output": inf.output_file}
    return {"max_new_tokens": args.max_new_tokens, "default_max_new_tokens": default, "do_sample": bool(args.do_sample),
            "temperature": 1.0 if args.temperature is None else args.temperature,
            "top_k": 0 if args.top_k is None else args.top_k, "top_p": 1.0 if args.top_p is None else args.top_p,
            "stop_token_ids": tuple(args.stop_ids or ()), "slots": args.batch_size or 8, "seed": args.seed,
            "output": args.output}


def _check_output(path: str | None, force: bool = False, inputs: tuple[str | None, ...] = ()) -> None:
    if path is None:
        return
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory; give a file name for the output")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{path}: the directory {parent} does not exist")
    for given in inputs:  # never an input, whatever --force says (it is read before the output is written)
        if given and os.path.realpath(given) == os.path.realpath(path):
            raise UsageError(f"--output: {path} is also an input ({given}); write the results somewhere else")
    if os.path.lexists(path) and not force:
        raise UsageError(f"--output: {path} exists; pass --force to replace it")


def _write_jsonl(path: str, rows: list[dict]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _logging() -> None:
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for name in ("mf_models", "mf_ckpt"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.WARNING)
        if not logger.handlers:
            logger.addHandler(handler)
        logger.propagate = False


def _dry_run(args) -> int:
    """The checks `mf generate CONFIG` runs before it loads the model, without MindSpore or the
    weights: schema and rules, the preflight of `mf generate`, the tokenizer's kind, the output.
    Without prompts (neither flags nor inference.prompts / input_file) the config is checked as
    `mf serve` checks it, with the prompts left to the real run."""
    import mf_config
    from mf_cli.checks import check, completed, load_config

    if not os.path.isfile(args.source):
        raise UsageError(f"{args.source}: --dry-run checks a predict YAML; give the config file")
    overrides = [*_config_overrides(args), *args.overrides]
    if args.tokenizer:
        overrides += [f"tokenizer.path={json.dumps(args.tokenizer)}",
                      f"tokenizer.type={'hf' if os.path.isdir(args.tokenizer) else 'sentencepiece'}"]
    prompts_later = False
    try:
        cfg = mf_config.load_config(args.source, overrides=overrides)
    except mf_config.ConfigError as exc:
        if exc.key_path != "inference.prompts" or "needs inference.prompts" not in exc.problem:
            raise UsageError(str(exc)) from None
        prompts_later = True  # checked as `mf serve` checks it; the real run takes --prompt / --input
        cfg = load_config(args.source, [*overrides, 'inference.prompts=["-"]'])
    # The config the real run checks: a fine-tune's model from its base, the weights it would use.
    import mf_trainer
    from mf_cli.commands.eval import explicit_weights
    from mf_trainer.sources import weights_for_inference

    notes: list[str] = []
    try:
        cfg = completed(cfg, notes)
        cfg, note = weights_for_inference(cfg, explicit_weights(args))
    except (*bad_input_errors(), mf_trainer.TrainerConfigError) as exc:
        raise UsageError(str(exc).strip().splitlines()[0]) from None
    notes += [note] if note else []
    check(cfg, "generate", 1, cfg.context.device_target, source=args.source)
    tok = cfg.tokenizer
    if tok.path and os.path.exists(tok.path) and ("hf" if os.path.isdir(tok.path) else "sentencepiece") != tok.type:
        raise UsageError(f"tokenizer.type: {tok.type!r}, but {tok.path} is a "
                         f"{'directory' if os.path.isdir(tok.path) else 'file'}")
    if cfg.inference.input_file and not os.path.isfile(cfg.inference.input_file):
        raise UsageError(f"inference.input_file: {cfg.inference.input_file}: no such file")
    _check_output(cfg.inference.output_file, args.force, (args.input, cfg.inference.input_file, args.source))
    for line in notes:           # after every check: a refusal stays one line on stderr, nothing on stdout
        print(f"mf generate: dry run: note: {line}")
    for warning in mf_config.path_warnings(cfg):
        print(f"mf generate: dry run: warning: {warning}")
    inf = cfg.inference
    prompts = ("none yet: give --prompt TEXT, --input FILE or inference.prompts" if prompts_later
               else f"{len(inf.prompts)} in the config" if inf.prompts else f"from {inf.input_file}")
    sampling = (f"sampling (temperature {inf.temperature}, top_k {inf.top_k}, top_p {inf.top_p})" if inf.do_sample
                else "greedy")
    most = (f"at most {inf.max_new_tokens} new tokens" if _explicit_max_new_tokens(args) else
            "the checkpoint's max_new_tokens (else 128) new tokens at most, fitted to the positions left")
    for line in (f"model: {cfg.model.model_type} ({cfg.model.architectures})",
                 f"weights: {cfg.checkpoint.load_path}", f"tokenizer: {tok.path} ({tok.type})",
                 f"prompts: {prompts}", f"decoding: {sampling}, {most}, {inf.batch_size} at once",
                 f"output: {inf.output_file or 'stdout'}"):
        print(f"mf generate: dry run: {line}")
    print(f"mf generate: dry run: {args.source} passes the preflight of mf generate; nothing was loaded or written")
    return 0


def run(args) -> int:
    os.environ.setdefault("GLOG_v", "3")  # MindSpore's C++ log is chatty; the user can still ask for it
    if args.dry_run:
        return _dry_run(args)
    _logging()
    is_config = os.path.isfile(args.source)
    if not is_config and args.overrides:
        raise UsageError("--set applies to a YAML config, not to a checkpoint directory")
    from mf_cli.commands.eval import explicit_weights

    source = load_source(args.source, tokenizer=args.tokenizer, overrides=args.overrides, mode=args.mode,
                         predict_overrides=_config_overrides(args) if is_config else [],
                         weights=explicit_weights(args) if is_config else args.weights)
    items = _prompts(args, source)
    settings = _sampling_settings(args, source)
    unused = [f"--{flag.replace('_', '-')}" for flag in ("temperature", "top_k", "top_p", "seed")
              if getattr(args, flag) is not None]
    if unused and not settings["do_sample"]:
        raise UsageError(f"{', '.join(unused)}: greedy decoding would ignore this; add --do-sample"
                         + (" (or set inference.do_sample: true)" if source.inference is not None else ""))
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError(f"--batch-size: must be at least 1, got {args.batch_size}")
    inputs = (args.input, source.inference.input_file if source.inference is not None else None, args.source,
              args.tokenizer)
    _check_output(settings["output"], args.force, inputs)
    prompt_ids = []
    for item in items:
        if "prompt_ids" in item:
            prompt_ids.append(item["prompt_ids"])
        elif source.tokenizer is None:
            raise UsageError(f"{args.source}: no tokenizer found for text prompts; give --tokenizer or token ids")
        else:
            prompt_ids.append(source.tokenizer.encode(item["prompt"]))
    _check_prompt_ids(items, prompt_ids, source, args.input)
    # After every check of the command line: bad input stays one line on stderr.
    for note in source.notes:
        print(f"mf generate: note: {note}", file=sys.stderr)
    return _generate(args, source, items, prompt_ids, settings)


def _check_prompt_ids(items: list[dict], prompt_ids: list[list[int]], source: Source, input_file: str | None) -> None:
    """Every given token id names a token of the model, and of the tokenizer that turns the prompt
    back into text (before anything decodes it: sentencepiece raises on an id it does not have)."""
    limit = int(source.model.args.vocab_size)
    if source.tokenizer is not None:
        limit = min(limit, int(source.tokenizer.vocab_size))
    for item, ids in zip(items, prompt_ids):
        bad = next((t for t in ids if not 0 <= t < limit), None)
        if bad is not None and "prompt_ids" in item:
            where = f"{input_file}: prompt_ids" if input_file else "--prompt-ids"
            raise UsageError(f"{where}: token id {bad} is outside the vocabulary [0, {limit})")


def _generate(args, source: Source, items: list[dict], prompt_ids: list[list[int]], settings: dict) -> int:
    from mf_models.inference import InferenceEngine, RequestError, SamplingParams, TextStream

    limit = source.model.args.max_position_embeddings
    longest = max(len(p) for p in prompt_ids)
    new = settings["max_new_tokens"]
    if new is None:   # not asked for: the checkpoint's default (or 128), at most what the positions leave
        new = max(1, min(settings.get("default_max_new_tokens") or 128, limit - longest))
    seed = settings["seed"]
    try:
        params = [SamplingParams(max_new_tokens=new, do_sample=settings["do_sample"],
                                 temperature=settings["temperature"], top_k=settings["top_k"], top_p=settings["top_p"],
                                 seed=None if seed is None else seed + i, stop_token_ids=settings["stop_token_ids"],
                                 ignore_eos=args.ignore_eos) for i in range(len(prompt_ids))]
        if longest + new > limit:
            raise RequestError(f"the longest prompt ({longest} tokens) + max_new_tokens {new} exceeds the model's "
                               f"max_position_embeddings {limit}")
        engine = InferenceEngine(source.model, max_slots=min(settings["slots"], len(prompt_ids)),
                                 max_len=longest + new, eos_token_ids=source.eos_token_ids)
    except ValueError as exc:  # SamplingParams / RequestError / engine settings: one line
        raise UsageError(str(exc)) from None
    if args.stop and source.tokenizer is None:
        raise UsageError("--stop: stop strings need a tokenizer; give --tokenizer or use --stop-token-id")
    texts: dict[int, TextStream] = {}
    if source.tokenizer is not None:
        texts = {i: TextStream(source.tokenizer.decode, args.stop, ids) for i, ids in enumerate(prompt_ids)}
    index_of: dict[int, int] = {}

    def on_update(request, new_ids: list[int]) -> None:
        stream = texts.get(index_of.get(request.id, -1))
        if stream is not None:
            stream.push(new_ids)
            if stream.stopped and not request.finished:
                request.cancel("stop")

    started = time.perf_counter()
    try:
        requests = [engine.make_request(ids, p, on_update) for ids, p in zip(prompt_ids, params)]
        for i, request in enumerate(requests):
            index_of[request.id] = i
            engine.scheduler.submit(request)
        while not all(r.finished for r in requests):
            engine.step()
    except RequestError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # a failure while generating: exit 1
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"mf generate: generation failed: {message}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - started
    rows = []
    for i, (item, request) in enumerate(zip(items, requests)):
        row = {"id": item["id"]} if "id" in item else {}
        row.update({"prompt": item.get("prompt"), "prompt_ids": request.prompt_ids,
                    "completion": texts[i].text if i in texts else None, "completion_ids": request.output_ids,
                    "prompt_tokens": len(request.prompt_ids), "completion_tokens": request.completion_tokens,
                    "finish_reason": request.finish_reason})
        rows.append(row)
    if settings["output"]:
        _write_jsonl(settings["output"], rows)
    else:
        for row in rows:
            if row["completion"] is not None:
                print(f"{row['prompt'] or ''}{row['completion']}\n")
            else:
                print(" ".join(map(str, row["completion_ids"])))
    stats = engine.stats
    generated = sum(r.completion_tokens for r in requests)
    compiled = f" without the first calls of its {stats.graphs_built} graphs ({stats.first_call_seconds:.2f} s" + \
        (", where they compile)" if is_graph_mode() else ")")
    print(f"mf generate: {len(rows)} prompt(s), {sum(len(p) for p in prompt_ids)} prompt tokens, {generated} "
          f"generated tokens in {elapsed:.2f} s; {stats.tokens_per_second:.1f} tokens/s{compiled}: prefill "
          f"{stats.prefill_seconds:.2f} s, {stats.decode_steps} decode steps {stats.decode_seconds:.2f} s"
          + (f"; wrote {settings['output']}" if settings["output"] else ""), file=sys.stderr)
    return 0
