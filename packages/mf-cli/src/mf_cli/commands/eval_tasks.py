"""`mf eval CONFIG|CHECKPOINT --tasks NAMES ...`: lm-evaluation-harness in this process over mf's
model (see eval.py for the command, mf_cli.harness for the model).

CONFIG: an eval or training YAML, its model and weights as `mf eval` picks them. CHECKPOINT: an mf
checkpoint or Hugging Face directory, as `mf serve` and `mf generate` load it (the model from its
config, the tokenizer it carries), so the same directory can be evaluated in process and served."""

from __future__ import annotations

import json
import os
import sys

from mf_cli.errors import UsageError

DEFAULT_BATCH_SIZE = 8


def _lm_eval():
    try:
        import lm_eval
    except ImportError:
        raise UsageError('--tasks runs lm-evaluation-harness, which is not installed: pip install "mf-cli[eval]"') \
            from None
    return lm_eval


def _task_names(args, task_manager) -> list[str]:
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not names:
        raise UsageError("--tasks: no task names")
    unknown = [n for n in names if not task_manager.match_tasks([n])]
    if unknown:
        where = f" (nor in --include-path {args.include_path})" if args.include_path else ""
        raise UsageError(f"--tasks: no lm-eval task named {unknown[0]!r}{where}; `lm-eval ls tasks` lists them")
    return names


def _checked(args) -> None:
    if args.include_path is not None and not os.path.isdir(args.include_path):
        raise UsageError(f"--include-path: {args.include_path} is not a directory")
    for flag, value, low in (("--batch-size", args.batch_size, 1), ("--max-length", args.max_length, 2),
                             ("--num-fewshot", args.num_fewshot, 0)):
        if value is not None and value < low:
            raise UsageError(f"{flag}: must be at least {low}, got {value}")
    if args.whole_split:
        raise UsageError("--all applies to the eval_dataset evaluation; with --tasks, --limit bounds the documents")
    if args.tokenizer is not None and not os.path.exists(args.tokenizer):
        raise UsageError(f"--tokenizer: {args.tokenizer}: no such file or directory")


def _tokenizer_path(args, cfg, notes: list[str]) -> str:
    from mf_models.inference import find_tokenizer, read_checkpoint_info

    if args.tokenizer:
        return args.tokenizer
    if cfg.tokenizer.path:
        return cfg.tokenizer.path
    _, _, common = read_checkpoint_info(cfg.checkpoint.load_path)
    found = find_tokenizer(cfg.checkpoint.load_path, common, notes)
    if found is None:
        raise UsageError("--tasks needs the model's tokenizer: set tokenizer.path, pass --tokenizer PATH, or evaluate "
                         "a checkpoint that carries one")
    return found


def _task_lines(results: dict) -> list[str]:
    lines = []
    samples = results.get("n-samples", {})
    for task, metrics in results.get("results", {}).items():
        shown = []
        for key, value in metrics.items():
            if key in ("alias", "sample_len", "samples") or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            metric, _, _filter = key.partition(",")
            stderr = metrics.get(f"{metric}_stderr,{_filter}")
            error = f" +- {stderr:.4f}" if isinstance(stderr, (int, float)) else ""
            shown.append(f"{metric} {value:.4f}{error}")
        count = samples.get(task, {}).get("effective")
        lines.append(f"mf eval: {task}: {', '.join(shown) or 'no metrics'}"
                     + (f" ({count} samples)" if count is not None else ""))
    return lines


class Loaded:
    def __init__(self, model, tokenizer, name: str, what: str, notes: list[str], output_dir: str):
        self.model, self.tokenizer, self.name, self.what, self.notes = model, tokenizer, name, what, notes
        self.output_dir = output_dir


def _from_directory(args) -> Loaded:
    from mf_cli.commands.generate import load_source

    source = load_source(args.config, tokenizer=args.tokenizer, overrides=args.overrides, weights=args.weights,
                         command="eval")
    if source.tokenizer is None:
        raise UsageError(f"{args.config}: carries no tokenizer, which lm-eval tasks need: pass --tokenizer PATH")
    source.model.set_train(False)
    return Loaded(source.model, source.tokenizer, source.name, args.config, source.notes, ".")


def _from_config(args) -> Loaded:
    from mf_cli.checks import bad_input_message, check, completed, load_config
    from mf_cli.commands.eval import explicit_weights
    from mf_cli.commands.generate import TokenizerAdapter, bad_input_errors
    from mf_cli.commands.train import _bad_input_errors
    from mf_trainer.environment import world_size_from_env
    from mf_trainer.evaluation import DATA_SECTIONS
    from mf_trainer.sources import weights_for_inference

    config = load_config(args.config, args.overrides)
    weights = explicit_weights(args)
    try:
        checked, _ = weights_for_inference(completed(config), weights)
    except bad_input_errors() as exc:
        raise UsageError(bad_input_message(exc)) from None
    check(checked, "eval", world_size_from_env(), config.context.device_target, source=args.config,
          unused=DATA_SECTIONS)
    import mf_trainer

    try:
        model, cfg, what = mf_trainer.evaluated_model(config, weights, data=False)
    except _bad_input_errors() as exc:
        raise UsageError(bad_input_message(exc)) from None
    notes: list[str] = []
    tokenizer = TokenizerAdapter(_tokenizer_path(args, cfg, notes))
    if cfg.eval_dataset is not None:
        notes.append("eval_dataset is not used: lm-eval tasks bring their own data")
    from mf_models.inference import model_name, read_checkpoint_info

    name = model_name(cfg.checkpoint.load_path, read_checkpoint_info(cfg.checkpoint.load_path)[2])
    return Loaded(model, tokenizer, name, what, notes, cfg.output_dir)


def run_tasks(args) -> int:
    _checked(args)
    _lm_eval()
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable

    from mf_cli.harness import MFLM

    task_manager = TaskManager(include_path=args.include_path)
    names = _task_names(args, task_manager)
    if not os.path.exists(args.config):
        raise UsageError(f"{args.config}: no such file or directory")
    from mf_cli.commands.train import _logging

    _logging("stderr")  # stdout carries the result
    loaded = _from_directory(args) if os.path.isdir(args.config) else _from_config(args)
    for note in loaded.notes:
        print(f"mf eval: note: {note}", file=sys.stderr)
    batch_size = args.batch_size or DEFAULT_BATCH_SIZE
    lm = MFLM(loaded.model, loaded.tokenizer, batch_size=batch_size, max_length=args.max_length, name=loaded.name)
    output = args.output_path or os.path.join(loaded.output_dir, "lm_eval")
    tracker = EvaluationTracker(output_path=output)
    seed = args.seed if args.seed is not None else 0
    print(f"mf eval: {', '.join(names)} with {loaded.what} ({loaded.name}), tokenizer {loaded.tokenizer.path}, "
          f"batch {batch_size}, context {lm.max_length} tokens", file=sys.stderr)
    try:
        results = simple_evaluate(model=lm, model_args={"pretrained": loaded.name}, tasks=names,
                                  num_fewshot=args.num_fewshot, batch_size=batch_size, limit=args.limit,
                                  log_samples=args.log_samples, evaluation_tracker=tracker, task_manager=task_manager,
                                  random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                  fewshot_random_seed=seed)
    except UsageError:
        raise
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a task's data that cannot be read, a kernel failure: exit 1, one line
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"mf eval: evaluation failed: {type(exc).__name__}: {message}", file=sys.stderr)
        return 1
    samples = results.pop("samples", None)
    tracker.save_results_aggregated(results=results, samples=samples)
    if args.log_samples and samples:
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
    if args.json:
        print(json.dumps(results["results"], default=handle_non_serializable))
    else:
        for line in _task_lines(results):
            print(line)
    print(f"mf eval: results written to {os.path.join(output, tracker.general_config_tracker.model_name_sanitized)}",
          file=sys.stderr)
    return 0
