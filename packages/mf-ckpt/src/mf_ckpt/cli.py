"""`mf-ckpt` (also `mf ckpt`): inspect, verify, merge, convert checkpoints and merge LoRA adapters.

Bad input never shows a traceback: one line on stderr and exit status 2; outputs are written to a
temp directory renamed into place, and a non-empty destination is refused without --force.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .errors import CheckpointError
from .hf.convert import supported_model_types
from .inspection import describe, verify
from .lora_tools import merge_lora_checkpoint
from .tools import convert_hf_to_mf, convert_mf_to_hf, merge
from .units import format_size, parse_size

EXIT_BAD_INPUT = 2


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print the usage too: keep it to one line
        raise _UsageError(f"{self.prog}: {message}")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except CheckpointError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


ITERATION_HELP = "an iteration other than the latest committed one (mf save directories)"


def build_parser(prog: str = "mf-ckpt") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Inspect, verify, merge and convert mf checkpoints.")
    parser.add_argument("--version", action="version", version=f"mf-ckpt {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = sub.add_parser("inspect", help="show step, tensors, shapes, dtypes, shards and sizes")
    p.add_argument("path", help="save directory, iteration directory, HF directory or merged directory")
    p.add_argument("--iteration", type=int, help=ITERATION_HELP)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("verify", help="check metadata against every file and read every chunk")
    p.add_argument("path", help="save directory, iteration directory, HF directory or merged directory")
    p.add_argument("--iteration", type=int, help=ITERATION_HELP)

    p = sub.add_parser("merge", help="write one full (unsharded) copy, optionally in size-limited shards")
    p.add_argument("path", help="the checkpoint to merge (any directory `inspect` reads)")
    p.add_argument("out", help="the merged directory to write (model.safetensors [+ optimizer], common.json)")
    p.add_argument("--iteration", type=int, help=ITERATION_HELP)
    p.add_argument("--max-shard-size", type=_size, help="e.g. 2GB: shards plus an HF-style index")
    p.add_argument("--no-optim", action="store_true", help="leave the optimizer state out")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")

    p = sub.add_parser("convert", help="Hugging Face <-> mf (LoRA adapters: PEFT <-> mf)")
    p.add_argument("--from", dest="src_format", choices=["hf", "mf"], required=True,
                   help="the format of SRC: hf (config.json + safetensors, or a PEFT adapter) or mf")
    p.add_argument("--to", dest="dst_format", choices=["hf", "mf"], required=True,
                   help="the format to write at DST")
    p.add_argument("--arch", help="hf source: the architecture config.json must declare "
                                  f"({', '.join(supported_model_types())}); default: its model_type")
    p.add_argument("--hf-config", help="config.json (or its directory): mf -> hf when the checkpoint carries none; "
                                       "a PEFT source whose base is not a local directory")
    p.add_argument("--iteration", type=int, help="mf source: iteration; hf source: iteration to write (default 0)")
    p.add_argument("--max-shard-size", type=_size, help="hf output: shard size limit, e.g. 2GB")
    p.add_argument("--force", action="store_true", help="replace a non-empty DST")
    p.add_argument("src", help="the checkpoint to convert")
    p.add_argument("dst", help="the directory to write")

    p = sub.add_parser("merge-lora", help="merge a LoRA adapter checkpoint into its base weights")
    p.add_argument("base", help="the base weights: mf checkpoint, merged directory or Hugging Face directory")
    p.add_argument("adapter", help="an adapter-only mf checkpoint (written by a LoRA fine-tune)")
    p.add_argument("out", help="where the merged weights go")
    p.add_argument("--to", dest="dst_format", choices=["mf", "hf"], default="mf",
                   help="mf checkpoint (default) or Hugging Face directory")
    p.add_argument("--hf-config", help="--to hf: config.json (or its directory) when neither checkpoint carries one")
    p.add_argument("--max-shard-size", type=_size, help="--to hf: shard size limit, e.g. 2GB")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")
    return parser


def _print_inspect(info: dict) -> None:
    kinds = {"mf": "mf checkpoint", "hf": "Hugging Face directory", "safetensors": "merged safetensors directory"}
    head = f"{kinds[info['kind']]}: {info['path']}"
    if info["iteration"] is not None:
        head += f"\niteration: {info['iteration']}"
    if info["world_size"]:
        head += f"\nsaved by: {info['world_size']} rank(s)"
    print(head)
    scalars = {k: v for k, v in info["common"].items() if isinstance(v, (int, float, str, bool))}
    if scalars:
        print("common: " + ", ".join(f"{k}={v}" for k, v in sorted(scalars.items())))
    others = sorted(k for k in info["common"] if k not in scalars)
    if others:
        print("common (structured): " + ", ".join(others))
    for part, tensors in info["parts"].items():
        print(f"{part}: {len(tensors)} tensors, {format_size(info['tensor_bytes'][part])}")
        width = max((len(n) for n in tensors), default=0)
        for name, t in tensors.items():
            shape = "[" + ", ".join(str(d) for d in t["shape"]) + "]"
            if "mf" in t:  # an HF directory: its own names, and the mf tensor each becomes
                print(f"  {name:<{width}}  {t['dtype']:<7} {shape:<20} -> {t['mf'] or '(skipped: no mf counterpart)'}")
            else:
                print(f"  {name:<{width}}  {t['dtype']:<7} {shape:<20} chunks={t['chunks']}")
    files = info["files"]
    print(f"files: {len(files)}, {format_size(info['file_bytes'])}")
    for name, size in files.items():
        print(f"  {name}  {format_size(size) if size is not None else 'MISSING'}")
    if info["assets"]:
        print(f"carried files: {len(info['assets'])}")
        for name, a in info["assets"].items():
            print(f"  {name}  {format_size(a['bytes'])}  crc32c {a['crc32c']}")


def _run(args: argparse.Namespace) -> int:
    progress = sys.stderr.isatty()
    if args.command == "inspect":
        info = describe(args.path, args.iteration)
        if args.json:
            print(json.dumps(info, indent=2, sort_keys=True))
        else:
            _print_inspect(info)
        return 0
    if args.command == "verify":
        result = verify(args.path, args.iteration, progress=progress)
        if result["checksums_verified"] == result["chunks"]:
            checked = "every chunk matches its crc32c checksum"
        elif result["kind"] == "mf" and not result["checksums_verified"]:
            checked = "no checksums recorded (written before mf-ckpt 0.3): data read back but not checked against any"
        elif not result["checksums_verified"]:
            checked = f"a {result['kind']} directory carries no checksums: data read back but not checked against any"
        else:
            checked = f"{result['checksums_verified']} of {result['chunks']} chunks checked against their checksums"
        carried = f"; {len(result['assets'])} carried file(s) match theirs" if result["assets"] else ""
        print(f"OK: {result['tensors']} tensors, {result['chunks']} chunks, {format_size(result['bytes'])} "
              f"read back from {result['path']}; {checked}{carried}")
        return 0
    if args.command == "merge":
        merge(args.path, args.out, iteration=args.iteration, max_shard_size=args.max_shard_size,
              optimizer=not args.no_optim, overwrite=args.force, progress=progress)
        print(f"merged into {args.out}")
        return 0
    if args.command == "convert":
        if (args.src_format, args.dst_format) == ("hf", "mf"):
            if args.max_shard_size:
                raise _UsageError("mf-ckpt convert: --max-shard-size applies to --to hf only")
            convert_hf_to_mf(args.src, args.dst, arch=args.arch, iteration=args.iteration or 0,
                             hf_config=args.hf_config, overwrite=args.force, progress=progress)
        elif (args.src_format, args.dst_format) == ("mf", "hf"):
            if args.arch:
                raise _UsageError("mf-ckpt convert: --arch applies to --from hf only (mf -> hf uses the carried config.json)")
            convert_mf_to_hf(args.src, args.dst, iteration=args.iteration, hf_config=args.hf_config,
                             max_shard_size=args.max_shard_size, overwrite=args.force, progress=progress)
        else:
            raise _UsageError(f"mf-ckpt convert: --from {args.src_format} --to {args.dst_format} is not a conversion")
        print(f"converted {args.src} ({args.src_format}) -> {args.dst} ({args.dst_format}){_written(args.dst)}")
        return 0
    if args.command == "merge-lora":
        if args.dst_format == "mf" and (args.hf_config or args.max_shard_size):
            raise _UsageError("mf-ckpt merge-lora: --hf-config and --max-shard-size apply to --to hf only")
        summary = merge_lora_checkpoint(args.base, args.adapter, args.out, to=args.dst_format, hf_config=args.hf_config,
                                        max_shard_size=args.max_shard_size, overwrite=args.force, progress=progress)
        print(f"merged {summary['modules']} LoRA module(s) (rank {summary['rank']}, alpha {summary['alpha']:g}) of "
              f"{args.adapter} into {summary['base']} -> {args.out} ({args.dst_format}, {format_size(summary['bytes'])})")
        return 0
    raise AssertionError(args.command)


def _written(out: str) -> str:
    """What an output holds besides its weights (the tokenizer, generation config), said after `convert`."""
    from .sources import open_source
    from .tokenizer_files import TOKENIZER_DIR, hf_tokenizer_files

    root = Path(out)
    if (root / "adapter_config.json").is_file():
        extra = ["PEFT LoRA adapter: adapter_config.json + adapter_model.safetensors"]
        tokenizer = sorted(hf_tokenizer_files(root))
    elif (root / "config.json").is_file():
        extra = ["config.json"] + (["generation_config.json"] if (root / "generation_config.json").is_file() else [])
        tokenizer = sorted(hf_tokenizer_files(root))
    else:
        layout = open_source(root)
        extra = ["LoRA adapter"] if "adapter" in layout.common else []
        tokenizer = sorted(name.split("/", 1)[1] for name in layout.info.get("assets", {})
                           if name.startswith(TOKENIZER_DIR + "/"))
    extra.append(f"tokenizer: {', '.join(tokenizer)}" if tokenizer else "no tokenizer (the source carries none)")
    return f" [{'; '.join(extra)}]"


def main(argv: Sequence[str] | None = None, prog: str = "mf-ckpt") -> int:
    """Entry point of `mf-ckpt` and of `mf ckpt` (`prog`: the name it is called by, in usage and
    messages); returns the exit status."""
    try:
        args = build_parser(prog).parse_args(argv)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            status = _run(args)
        for w in caught:
            print(f"{prog}: warning: {w.message}", file=sys.stderr)
        return status
    except (_UsageError, CheckpointError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `mf-ckpt inspect DIR | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # keeps the interpreter's exit flush quiet
        return 0
    except OSError as e:  # disk full, permission denied...: still one line, nothing half-written
        print(f"{prog}: error: {e.filename or ''}: {e.strerror or e}".replace("error: : ", "error: "), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
