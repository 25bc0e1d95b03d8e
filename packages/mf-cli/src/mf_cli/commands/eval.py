"""`mf eval CONFIG [--set key=value ...] [--all] [--json]`: loss, perplexity and token accuracy;
`mf eval CONFIG --tasks NAMES [--include-path DIR] [--limit N]`: lm-evaluation-harness tasks.

CONFIG is a `run_mode: eval` YAML or any training YAML: the model of its `model` section (a
fine-tune without one: its base's) with the weights of `checkpoint.load_path` (an mf checkpoint, a
LoRA adapter checkpoint merged into the base it records, or a Hugging Face directory); for a
training (train / finetune) YAML the weights its run produced instead, the last checkpoint in
`checkpoint.save_path` (the fine-tuned weights), unless `--weights PATH` or `--set
checkpoint.load_path=...` says otherwise; stderr says which weights were used. Evaluated on `eval_dataset` (or, without one, on the
valid split of `train_dataset`) over `eval_dataset.eval_iters` batches of
`training.local_batch_size` samples, or the whole split with `--all` (mf_trainer.evaluation says
exactly how). `context.mode` 0 compiles the forward (GRAPH_MODE), 1 runs it in PyNative.

Output: one line on stdout, `mf eval: loss 3.2100, ppl 24.78, accuracy 31.20% over 4096 tokens
(8 batches, 32 samples) of eval_dataset (train split) in 0.41 s`, or the numbers as one JSON object
with `--json`. Exit status: 0 done, 2 bad input (one line on stderr, before any work: the YAML, the
data, the checkpoint), 1 a failure while evaluating.

With `--tasks` (comma-separated lm-eval task names, or task YAMLs in `--include-path DIR`), the
same model and weights are evaluated by lm-evaluation-harness in this process (mf_cli.harness: the
`eval` extra, `pip install "mf-cli[eval]"`), on the tasks' own data: the YAML's data sections are
not used (a note says so), and the tokenizer is `tokenizer.path`, `--tokenizer`, or the one the
checkpoint carries. Results are written as lm-eval writes them (`--output-path`, default
`<output_dir>/lm_eval`: `<model>/results_<date>.json`, and `samples_<task>_<date>.jsonl` per task
with `--log-samples`), and one line per task and metric goes to stdout:
`mf eval: arc_easy: acc 0.4310 +- 0.0101 (2376 samples)`; `--json` prints lm-eval's results
object instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from mf_cli.errors import UsageError


def add_parser(subparsers, name: str, help_text: str) -> None:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("config", help="a run_mode eval YAML, or a training YAML (its eval data / valid split); with "
                                       "--tasks also a checkpoint or HF directory")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key before validation (repeatable), e.g. checkpoint.load_path=out/checkpoint")
    parser.add_argument("--all", dest="whole_split", action="store_true",
                        help="evaluate the whole split instead of eval_dataset.eval_iters batches")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    parser.add_argument("--weights", metavar="PATH",
                        help="evaluate these weights (mf checkpoint, LoRA adapter checkpoint or HF directory) instead "
                             "of the config's: for a training YAML, its save_path's last checkpoint")
    harness = parser.add_argument_group("lm-evaluation-harness tasks (pip install \"mf-cli[eval]\")")
    harness.add_argument("--tasks", metavar="NAMES", help="comma-separated lm-eval task names (e.g. arc_easy,hellaswag)")
    harness.add_argument("--include-path", metavar="DIR", help="a directory of extra task YAMLs")
    harness.add_argument("--limit", type=_limit, metavar="N",
                         help="at most N documents per task (a fraction below 1: that share of them)")
    harness.add_argument("--num-fewshot", type=int, metavar="N", help="few-shot examples per prompt (the task's default)")
    harness.add_argument("--batch-size", type=int, metavar="N",
                         help="sequences scored in one forward, and requests generated together (default 8)")
    harness.add_argument("--max-length", type=int, metavar="N",
                         help="context length in tokens (default: the model's max_position_embeddings)")
    harness.add_argument("--output-path", metavar="DIR", help="where results go (default: <output_dir>/lm_eval)")
    harness.add_argument("--log-samples", action="store_true", help="also write every document's requests and "
                                                                     "responses (samples_<task>_<date>.jsonl)")
    harness.add_argument("--tokenizer", metavar="PATH", help="sentencepiece .model or HF tokenizer directory "
                                                             "(default: tokenizer.path, else the checkpoint's)")
    harness.add_argument("--seed", type=int, help="seed of lm-eval's few-shot sampling and shuffles (default 0)")
    parser.set_defaults(run=run)


def _limit(text: str) -> float | int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)) or (value >= 1 and value != int(value)):
        raise argparse.ArgumentTypeError(f"expected a positive count or a fraction below 1, got {text!r}")
    return int(value) if value >= 1 else value


HARNESS_ONLY = ("include_path", "limit", "num_fewshot", "batch_size", "max_length", "output_path", "log_samples",
                "tokenizer", "seed")


def explicit_weights(args) -> str | None:
    """Weights the command line names: --weights, else the last --set checkpoint.load_path=..."""
    if getattr(args, "weights", None):
        return args.weights
    given = [o.split("=", 1)[1] for o in args.overrides if o.split("=", 1)[0].strip() == "checkpoint.load_path"]
    if given:
        import yaml

        value = yaml.safe_load(given[-1])
        return str(value) if value else None
    return None


def run(args) -> int:
    os.environ.setdefault("GLOG_v", "3")
    if args.tasks is not None:
        from mf_cli.commands.eval_tasks import run_tasks

        return run_tasks(args)
    given = [f"--{name.replace('_', '-')}" for name in HARNESS_ONLY if getattr(args, name) not in (None, False)]
    if given:
        raise UsageError(f"{given[0]} applies to lm-eval tasks: add --tasks NAMES")
    from mf_cli.checks import bad_input_message, check, completed, load_config
    from mf_cli.commands.generate import bad_input_errors
    from mf_trainer.environment import world_size_from_env
    from mf_trainer.sources import weights_for_inference

    config = load_config(args.config, args.overrides)
    weights = explicit_weights(args)
    try:
        checked, _ = weights_for_inference(completed(config), weights)
    except bad_input_errors() as exc:
        raise UsageError(bad_input_message(exc)) from None
    check(checked, "eval", world_size_from_env(), config.context.device_target, source=args.config)
    from mf_cli.commands.train import _bad_input_errors, _logging

    _logging("stderr")  # stdout carries the result
    import mf_trainer

    try:
        result = mf_trainer.evaluate(config, whole_split=args.whole_split, weights=weights)
    except _bad_input_errors() as exc:
        raise UsageError(bad_input_message(exc)) from None
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a failure while evaluating (a kernel, the device): exit 1
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"mf eval: evaluation failed: {message}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"loss": result.loss, "ppl": result.ppl, "accuracy": result.accuracy, "tokens": result.tokens,
                          "batches": result.batches, "samples": result.samples, "seconds": result.seconds,
                          "data": result.data, "weights": result.weights}))
    else:
        print(f"mf eval: loss {result.loss:.4f}, ppl {result.ppl:.4g}, accuracy {100.0 * result.accuracy:.2f}% over "
              f"{result.tokens} tokens ({result.batches} batches, {result.samples} samples) of {result.data} in "
              f"{result.seconds:.2f} s; weights {result.weights}")
    return 0
