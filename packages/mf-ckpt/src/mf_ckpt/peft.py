"""LoRA adapters in PEFT's layout (what the Hugging Face ecosystem loads) <-> mf adapter checkpoints.

PEFT saves a LoRA adapter as two files (PEFT's docs, "PEFT checkpoint format"):
- `adapter_model.safetensors`: for each adapted Linear module `<module>` of the transformers model
  (e.g. `model.layers.0.self_attn.q_proj`), `base_model.model.<module>.lora_A.weight` [r, in] and
  `base_model.model.<module>.lora_B.weight` [out, r] (the adapter name is not part of the keys);
- `adapter_config.json`: `peft_type` "LORA", `r`, `lora_alpha`, `target_modules`, ... The update
  of a module is `(lora_alpha / r) * B @ A` (`lora_alpha / sqrt(r)` with `use_rslora`).
An mf adapter holds `<mf module>.lora_a` [r, in] and `.lora_b` [out, r], scaled by alpha / r: the
same arrays, so only names change, through the architecture's rename plan (hf/). Settings mf's
LoRA has no counterpart for (DoRA, biases, per-module ranks, modules_to_save, ...) are refused
with one line naming the field, never dropped.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import assets as carried
from .errors import CheckpointError, brief, first_few
from .fsutil import atomic_output_dir, read_json
from .hf.convert import plan_for
from .hf.io import read_config
from .hf.rules import Plan
from .layout import CheckpointLayout
from .lora import _modules, make_lora_adapter_meta, plan_merge, read_all
from .progress import Progress
from .st_io import Entry, ReaderPool, read_header, write_file
from .tokenizer_files import hf_export_files, hf_tokenizer_files, tokenizer_assets, tokenizer_bytes, write_files

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
_KEY = re.compile(r"base_model\.model\.(.+)\.lora_([AB])\.weight")

# adapter_config.json fields with a setting mf's LoRA cannot honour: (field, values meaning "off", why).
_OFF_ONLY = (
    ("use_dora", (None, False), "DoRA adapters carry a magnitude vector mf's LoRA does not have"),
    ("bias", (None, "none"), "mf's LoRA trains no biases"),
    ("lora_bias", (None, False), "mf's LoRA trains no biases"),
    ("modules_to_save", (None, []), "fully trained extra modules are not part of an mf adapter"),
    ("rank_pattern", (None, {}), "mf's LoRA has one rank for every module"),
    ("alpha_pattern", (None, {}), "mf's LoRA has one alpha for every module"),
    ("fan_in_fan_out", (None, False), "weights stored [in, out] (GPT-2's Conv1D) do not occur in these models"),
    ("layer_replication", (None, []), "replicated layers have no counterpart in mf"),
    ("target_parameters", (None, []), "LoRA on bare parameters (not Linear modules) is not supported"),
    ("trainable_token_indices", (None, {}, []), "trainable token embeddings are not part of an mf adapter"),
)


def is_peft_dir(path: Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def module_names(plan: Plan) -> dict[str, str]:
    """{mf module: transformers module} of every weight the plan renames whole (Linear modules,
    norms, embeddings; not stacked experts)."""
    out = {}
    for name, target in plan.targets.items():
        piece = target.pieces[0]
        if len(target.pieces) == 1 and piece.whole and name.endswith(".weight") and piece.hf.endswith(".weight"):
            out[name[: -len(".weight")]] = piece.hf[: -len(".weight")]
    return out


def target_modules(adapted: Iterable[str], candidates: Iterable[str]) -> list[str]:
    """PEFT's `target_modules` (a list matches a module whose name equals an entry or ends with
    "." + entry) naming exactly `adapted`: the leaf names (`q_proj`) when every module of those
    names is adapted, else the full module names."""
    adapted = sorted(adapted)
    leaves = {m.rsplit(".", 1)[-1] for m in adapted}
    covered = {m for m in candidates if m.rsplit(".", 1)[-1] in leaves}
    return sorted(leaves) if covered == set(adapted) else adapted


def _number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def export_peft(layout: CheckpointLayout, meta: Mapping[str, Any], dst, *, hf_config: Mapping[str, Any],
                overwrite: bool = False) -> Path:
    """An mf LoRA adapter checkpoint -> a PEFT adapter directory (+ the tokenizer it carries)."""
    where = str(layout.root)
    plan = plan_for(hf_config)
    names = module_names(plan)
    state = read_all(layout)
    plan_merge({t.mf: t.shape for t in plan.targets.values()}, {n: a.shape for n, a in state.items()}, meta, where)
    entries = []
    adapted = []
    for module in _modules(set(state), where):
        hf = names.get(module)
        if hf is None:
            raise CheckpointError(f"{where}: adapted module {module!r} has no transformers module of its own "
                                  f"({plan.summary}); PEFT cannot hold it")
        adapted.append(hf)
        entries.append(Entry.of(f"{PREFIX}{hf}.lora_A.weight", state[module + ".lora_a"]))
        entries.append(Entry.of(f"{PREFIX}{hf}.lora_B.weight", state[module + ".lora_b"]))
    linear = [hf for mf, hf in names.items() if len(plan.targets[mf + ".weight"].shape) == 2]
    base = meta.get("base") if meta.get("base_kind") == "hf" else None
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "revision": None,
        "r": meta["rank"], "lora_alpha": _number(meta["alpha"]), "lora_dropout": meta.get("dropout") or 0.0,
        "target_modules": target_modules(adapted, linear), "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "modules_to_save": None, "init_lora_weights": True,
        "inference_mode": True, "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
        "alpha_pattern": {},
    }
    tokenizer = tokenizer_bytes(layout)
    tokenizer = hf_export_files(tokenizer, hf_config, where) if tokenizer else {}
    with atomic_output_dir(dst, overwrite=overwrite) as tmp:
        write_file(tmp / ADAPTER_WEIGHTS, entries, {"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if tokenizer:
            write_files(tmp, tokenizer)
    return Path(dst)


def _check_config(cfg: Any, where: str) -> tuple[int, float, float]:
    """(r, alpha in mf's convention, dropout) of a PEFT adapter_config.json."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{where}: must be a JSON object")
    if cfg.get("peft_type") != "LORA":
        raise CheckpointError(f"{where}: peft_type {brief(cfg.get('peft_type'))} is not supported (only 'LORA')")
    for key, off, why in _OFF_ONLY:
        if cfg.get(key) not in off:
            raise CheckpointError(f"{where}: {key} {brief(cfg.get(key))} is not supported: {why}")
    rank, alpha, dropout = cfg.get("r"), cfg.get("lora_alpha", 8), cfg.get("lora_dropout", 0.0)
    if type(rank) is not int or rank < 1:
        raise CheckpointError(f"{where}: r must be a positive integer, got {brief(rank)}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (alpha > 0 and math.isfinite(alpha)):
        raise CheckpointError(f"{where}: lora_alpha must be a positive number, got {brief(alpha)}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise CheckpointError(f"{where}: lora_dropout must be in [0, 1), got {brief(dropout)}")
    if cfg.get("use_rslora") not in (None, False, True):
        raise CheckpointError(f"{where}: use_rslora must be true or false, got {brief(cfg.get('use_rslora'))}")
    # PEFT scales by lora_alpha / sqrt(r) under rsLoRA; mf by alpha / r: the same update needs alpha * sqrt(r).
    return rank, float(alpha) * math.sqrt(rank) if cfg.get("use_rslora") else float(alpha), float(dropout)


def _strings(value: Any) -> list[str] | None:
    if isinstance(value, (list, tuple, set)) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _named_by(entries: list[str], module: str) -> bool:
    """PEFT's list form: a module is named by an entry equal to it or ending its dotted name."""
    return module in entries or any(module.endswith("." + e) for e in entries)


def _layer_index(module: str, patterns: list[str]) -> int | None:
    """The index of the layer a module sits in, found as PEFT finds it (the first numbered
    segment, or the one after one of `layers_pattern`)."""
    if not patterns:
        found = re.match(r".*?\.[^.]*\.(\d+)\.", module)
    else:
        found = next((m for p in patterns if (m := re.match(rf"(?:^|.*?\.){p}\.(\d+)\.", module))), None)
    return int(found.group(1)) if found else None


def peft_targets(cfg: dict, modules: Iterable[str], linear: Iterable[str], where: str) -> set[str]:
    """The modules of the base model (transformers names) PEFT applies this adapter_config's LoRA to:
    `exclude_modules`, then `target_modules` (a regex matched whole, "all-linear", or a list of
    names / name endings), then, for a list, `layers_to_transform` / `layers_pattern`."""
    targets, exclude = cfg.get("target_modules"), cfg.get("exclude_modules")
    if targets is None:
        raise CheckpointError(f"{where}: target_modules is missing (PEFT saves the modules it adapted)")
    if not isinstance(targets, str) and _strings(targets) is None:
        raise CheckpointError(f"{where}: target_modules must be a regular expression or a list of module names, "
                              f"got {brief(targets)}")
    if exclude is not None and not isinstance(exclude, str) and _strings(exclude) is None:
        raise CheckpointError(f"{where}: exclude_modules must be a regular expression or a list of module names, "
                              f"got {brief(exclude)}")
    layers, pattern = cfg.get("layers_to_transform"), cfg.get("layers_pattern")
    if layers is not None and not (type(layers) is int or (isinstance(layers, list)
                                                           and all(type(v) is int for v in layers))):
        raise CheckpointError(f"{where}: layers_to_transform must be a layer index or a list of them, got {brief(layers)}")
    patterns = [pattern] if isinstance(pattern, str) and pattern else _strings(pattern) if pattern else []
    if patterns is None:
        raise CheckpointError(f"{where}: layers_pattern must be a name or a list of names, got {brief(pattern)}")

    def matches(regex: str, module: str) -> bool:
        try:
            return re.fullmatch(regex, module) is not None
        except re.error as exc:
            raise CheckpointError(f"{where}: {brief(regex)} is not a regular expression ({exc})") from None

    chosen = set()
    for module in modules:
        if exclude and (matches(exclude, module) if isinstance(exclude, str) else _named_by(exclude, module)):
            continue
        if isinstance(targets, str):
            if targets.lower() == "all-linear":
                if module in set(linear):
                    chosen.add(module)
            elif matches(targets, module):
                chosen.add(module)
        elif module in targets:
            chosen.add(module)
        elif _named_by(targets, module):
            if layers is None or layers == []:
                chosen.add(module)
            else:
                index = _layer_index(module, patterns)
                if index is not None and (index == layers if type(layers) is int else index in layers):
                    chosen.add(module)
    return chosen


def _base_config(src: Path, cfg: dict, hf_config) -> tuple[dict, str | None]:
    """(config.json of the base model, the base directory when it is here)."""
    base = cfg.get("base_model_name_or_path")
    local = base if isinstance(base, str) and base and (Path(base) / "config.json").is_file() else None
    if hf_config is None:
        if local is None:
            raise CheckpointError(f"{src}: the adapter's base {brief(base)} is not a local Hugging Face directory; "
                                  "give its config.json with --hf-config")
        return read_config(local), os.path.abspath(local)
    if isinstance(hf_config, dict):
        return hf_config, local and os.path.abspath(local)
    path = Path(hf_config)
    config = read_json(path / "config.json" if path.is_dir() else path, "config.json")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: config.json must be a JSON object")
    return config, local and os.path.abspath(local)


def import_peft(src, dst, *, arch: str | None = None, iteration: int = 0, hf_config=None,
                overwrite: bool = False) -> Path:
    """A PEFT LoRA directory -> an mf adapter checkpoint (marked with its base when that is a local
    HF directory, so `mf generate` / `mf-ckpt merge-lora` find it)."""
    from .tools import write_single_rank_checkpoint

    src = Path(src)
    where = str(src / ADAPTER_CONFIG)
    cfg = read_json(src / ADAPTER_CONFIG, ADAPTER_CONFIG)
    rank, alpha, dropout = _check_config(cfg, where)
    weights = src / ADAPTER_WEIGHTS
    if not weights.is_file():
        pickled = " (adapter_model.bin is a pickle, which mf never loads)" if (src / "adapter_model.bin").exists() else ""
        raise CheckpointError(f"{src}: no {ADAPTER_WEIGHTS}{pickled}")
    config, base = _base_config(src, cfg, hf_config)
    if arch is not None and config.get("model_type") != arch:
        raise CheckpointError(f"{src}: the base's config.json has model_type {config.get('model_type')!r}, "
                              f"not --arch {arch!r}")
    plan = plan_for(config)
    to_mf = {hf: mf for mf, hf in module_names(plan).items()}
    header = read_header(weights)
    found: dict[str, str] = {}   # mf tensor name -> PEFT key
    for key in header.tensors:
        m = _KEY.fullmatch(key)
        if m is None:
            raise CheckpointError(f"{weights}: tensor {key!r} is not a LoRA weight PEFT saves for a Linear module "
                                  "(base_model.model.<module>.lora_A.weight / lora_B.weight)")
        module = to_mf.get(m.group(1))
        if module is None:
            raise CheckpointError(f"{weights}: tensor {key!r}: module {m.group(1)!r} is not a module of this "
                                  f"{plan.summary} model")
        found[f"{module}.lora_{m.group(2).lower()}"] = key
    modules = _modules(set(found), str(weights))
    # What PEFT itself would adapt: weights for a module its config does not target are ignored
    # there (an unexpected key), so converting them would merge what PEFT never applies.
    hf_modules = module_names(plan)
    linear = [hf for mf, hf in hf_modules.items() if len(plan.targets[mf + ".weight"].shape) == 2
              and not hf.endswith(("embed_tokens", "lm_head"))]
    targeted = peft_targets(cfg, hf_modules.values(), linear, where)
    stray = sorted(hf_modules[m] for m in modules if hf_modules[m] not in targeted)
    if stray:
        raise CheckpointError(
            f"{where}: {ADAPTER_WEIGHTS} holds LoRA weights for {len(stray)} module(s) its target_modules "
            f"{brief(cfg.get('target_modules'))}" + (f" / layers_to_transform {brief(cfg.get('layers_to_transform'))}"
                                                     if cfg.get("layers_to_transform") not in (None, []) else "")
            + f" does not select ({first_few(stray)}): PEFT would leave them out; the config and the weights disagree")
    shapes = {name: header.tensors[key].shape for name, key in found.items()}
    meta = make_lora_adapter_meta(rank=rank, alpha=alpha, dropout=dropout, modules=modules,
                                  target_modules="|".join(re.escape(m) for m in modules), base=base,
                                  base_kind="hf" if base else None)
    plan_merge({t.mf: t.shape for t in plan.targets.values()}, shapes, meta, str(weights))
    common = {"adapter": meta, "hf_config": config, "peft_adapter_config": cfg}
    tokenizer = carried.prepare(tokenizer_assets(hf_tokenizer_files(src)))
    with atomic_output_dir(dst, overwrite=overwrite) as tmp, ReaderPool({weights: header}) as pool, \
            Progress(sum(header.tensors[k].nbytes for k in found.values()), "convert") as bar:
        reader = pool.get(weights)

        def read(key: str):
            info = header.tensors[key]
            return reader.read(key, (0,) * len(info.shape), info.shape)

        entries = [Entry(name, header.tensors[key].dtype, header.tensors[key].shape, lambda key=key: read(key))
                   for name, key in sorted(found.items())]
        write_single_rank_checkpoint(tmp, None, None, iteration, common, bar, entries=entries, assets=tokenizer)
    return Path(dst)

