"""`recompute_config` and `swap_config` -> `recompute`, `recompute_comm`, `swap`.

MindFormers counts recomputed layers per pipeline stage (`recompute: [3, 4]` = the first 3 layers
of stage 0 and the first 4 of stage 1; per interleaved chunk with a nested list; spread over the
chunks of a stage round-robin otherwise) and selects operators by regular expression. mf names
layers by index (layer specs) and selects whole modules by path, so the counts become layer specs
and each operator pattern becomes the module that holds it (in deepseek_v3's MoE layers, MindFormers'
`feed_forward` is mf's `moe`). With `swap_config.swap`, MindFormers
reads the same lists as layer indices instead of counts.
"""

from __future__ import annotations

import re
from typing import Any

from mf_config.errors import fmt_value
from mf_config.legacy.session import Migration
from mf_config.legacy.tables import RECOMPUTE

RC = ("recompute_config",)
SW = ("swap_config",)
_DEFAULT_SELECT = (r"feed_forward\.mul", r"feed_forward\.w1\.activation\.silu")
_DEFAULT_COMM = (r".*\.norm",)
_NORM_MODULES = ["attention_norm", "ffn_norm"]
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ALL = 2**31 - 1


def specs(layers: set[int] | list[int]) -> list[str]:
    """[0, 1, 2, 3, 5] -> ['0-3', '5']."""
    out: list[str] = []
    ordered = sorted(set(layers))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(item: Any) -> int | None:
    if isinstance(item, bool):
        return _ALL if item else 0
    return item if _is_int(item) and item >= 0 else None


def layers_of(m: Migration, value: Any, by_index: bool) -> set[int] | None:
    """The layer ids a MindFormers recompute value selects; None when it cannot be read (unknown
    layer count or placement, or a malformed value)."""
    f = m.facts
    if isinstance(value, bool):
        if not value:
            return set()
        return None if f.num_layers is None else set(range(f.num_layers))
    if by_index:  # with swap on, MindFormers reads a list as layer indices
        ok = isinstance(value, (list, tuple)) and all(_is_int(v) and v >= 0 for v in value)
        return set(value) if ok else None
    if not isinstance(value, (list, tuple)) or f.stage_layers is None:
        return None
    pp, v = f.pipeline_parallel, f.interleave
    chunks = f.stage_layers  # virtual stage k*pp + s = chunk k of stage s
    if len(chunks) != pp * v:
        return None
    if all(not isinstance(x, (list, tuple)) for x in value):
        counts = [_count(x) for x in value]
        if len(counts) != pp or None in counts:
            return None
        per_chunk = [[0] * pp for _ in range(v)]
        for s, n in enumerate(counts):  # round-robin over the chunks of stage s, one layer at a time
            n = min(n, sum(len(chunks[k * pp + s]) for k in range(v)))
            while n:
                for k in range(v):
                    if n and per_chunk[k][s] < len(chunks[k * pp + s]):
                        per_chunk[k][s] += 1
                        n -= 1
    else:
        if len(value) != v or any(not isinstance(row, (list, tuple)) or len(row) != pp for row in value):
            return None
        per_chunk = [[_count(x) for x in row] for row in value]
        if any(None in row for row in per_chunk):
            return None
    chosen: set[int] = set()
    for k in range(v):
        for s in range(pp):
            chosen.update(chunks[k * pp + s][: per_chunk[k][s]])
    return chosen


def modules_of(pattern: str) -> list[str] | None:
    """The mf module(s) holding a MindFormers operator pattern: its first path component
    (`feed_forward\\.w1\\.activation\\.silu` -> feed_forward); MindFormers' norm default -> both norms."""
    if not isinstance(pattern, str):
        return None
    if pattern in _DEFAULT_COMM:
        return list(_NORM_MODULES)
    head = pattern.replace("\\.", ".").split(".")[0]
    return [head] if _IDENT.fullmatch(head) else None


def _moe_modules(m: Migration, chosen: dict[str, set[int]]) -> dict[str, set[int]]:
    """MindFormers calls the MLP of every layer feed_forward; mf's deepseek_v3 calls it moe in its MoE
    layers (those from first_k_dense_replace on)."""
    if m.facts.family != "deepseek_v3" or "feed_forward" not in chosen:
        return chosen
    dense = m.get_new("model.first_k_dense_replace", 3)  # Hugging Face's default when not given
    layers = chosen.pop("feed_forward")
    for module, part in (("feed_forward", {i for i in layers if i < dense}), ("moe", {i for i in layers if i >= dense})):
        if part:
            chosen.setdefault(module, set()).update(part)
    return chosen


def _selection(m: Migration, path: tuple, defaults: tuple[str, ...], by_index: bool) -> dict[str, set[int]] | None:
    """module -> layer ids from a select_recompute / select_comm_recompute value; reports what it
    could not read. None when the value is off."""
    value = m.value(path)
    if value is False or value is None:
        m.unneeded(path, "off")
        return None
    if isinstance(value, dict):
        items = [((*path, p), p, v) for p, v in value.items()]
    elif isinstance(value, (list, tuple)) and value and all(isinstance(x, str) for x in value):
        items = [(path, p, True) for p in value]
    else:
        items = [(path, p, value) for p in defaults]
    out: dict[str, set[int]] = {}
    for item_path, pattern, layer_value in items:
        modules, layers = modules_of(pattern), layers_of(m, layer_value, by_index)
        if modules is None:
            m.dropped(item_path, f"operator pattern {pattern!r} names no module mf can select")
        elif layers is None:
            m.action(item_path, f"{fmt_value(layer_value)} could not be turned into layers (layer count or pipeline "
                                "placement unknown): set the layer specs by hand")
        else:
            for module in modules:
                out.setdefault(module, set()).update(layers)
    for item_path, _, _ in items:
        m.src.mark(item_path)
    return _moe_modules(m, out)


def migrate_memory(m: Migration) -> None:
    by_index = m.value((*SW, "swap")) is True
    if m.src.mapping(RC):
        _recompute(m, by_index)
    if m.src.mapping(SW):
        _swap(m)


def _recompute(m: Migration, by_index: bool) -> None:
    full_path = (*RC, "recompute")
    full: set[int] = set()
    if m.src.has(full_path):
        value = m.value(full_path)
        layers = layers_of(m, value, by_index)
        if layers is None:
            m.action(full_path, f"{fmt_value(value)} could not be turned into layers (layer count or pipeline "
                                "placement unknown): set recompute.mode full and recompute.full_recompute_layer")
        elif layers:
            full = layers
            m.set("recompute", {"mode": "full", "full_recompute_layer": specs(layers)})
            how = ("every layer" if isinstance(value, bool) else "layer indices, as swap is on" if by_index
                   else f"the first layers of each pipeline stage, {value}")
            m.translated(full_path, f"recompute.mode: full, full_recompute_layer: {specs(layers)} ({how})")
        else:
            m.unneeded(full_path, "off")
    select_path = (*RC, "select_recompute")
    if m.src.has(select_path):
        reported = len(m.report)
        selected = _selection(m, select_path, _DEFAULT_SELECT, by_index) or {}
        chosen = {k: v - full for k, v in selected.items() if v - full}
        if not chosen and len(m.report) == reported:
            m.line(select_path, "unneeded", "full recompute already covers its layers (full wins in MindFormers too)"
                   if any(selected.values()) else "selects no layer", mark=False)
        elif chosen and full:
            m.line(select_path, "dropped", "mf's recompute has one mode: full recompute of its layers is kept, "
                   f"selective recompute of {', '.join(f'{k} {specs(v)}' for k, v in chosen.items())} is dropped",
                   mark=False)
        elif chosen:
            m.set("recompute", {"mode": "select", "select_module": {k: specs(v) for k, v in chosen.items()}})
            m.line(select_path, "translated", f"recompute.mode: select, select_module: "
                   f"{ {k: specs(v) for k, v in chosen.items()} } (mf selects whole modules: each operator pattern "
                   "becomes the module holding it, which recomputes more than those operators)", mark=False)
    comm_path = (*RC, "select_comm_recompute")
    if m.src.has(comm_path):
        reported = len(m.report)
        chosen = {k: v for k, v in (_selection(m, comm_path, _DEFAULT_COMM, by_index) or {}).items() if v}
        if not chosen and len(m.report) == reported:
            m.line(comm_path, "unneeded", "selects no layer", mark=False)
        if chosen:
            module_specs = {k: specs(v) for k, v in chosen.items()}
            m.set("recompute_comm", {"enable": True, "select_module": module_specs})
            m.line(comm_path, "translated", f"recompute_comm.enable: True, select_module: {module_specs}", mark=False)
    m.drop_table(RC, RECOMPUTE)


def _swap(m: Migration) -> None:
    sw = m.src.mapping(SW)
    if sw.get("swap") is not True:
        for key in sw:
            m.unneeded((*SW, key), "swap is off")
        return
    m.copy((*SW, "swap"), "swap.enable", True)
    if "default_prefetch" in sw:
        m.copy((*SW, "default_prefetch"), "swap.default_prefetch")
    every = set(range(m.facts.num_layers)) if m.facts.num_layers else None
    for kind in ("layer_swap", "op_swap"):
        items = sw.get(kind)
        if items is None:
            continue
        out = []
        for i, item in enumerate(items if isinstance(items, list) else []):
            path = (*SW, kind, i)
            item = item if isinstance(item, dict) else {}
            layers = every if item.get("layers") is True else (
                set(item["layers"]) if isinstance(item.get("layers"), list)
                and all(_is_int(x) for x in item["layers"]) else None)
            modules = modules_of(item.get("op_name", "")) if kind == "op_swap" else [None]
            if layers is None or modules is None:
                m.dropped(path, f"{fmt_value(item)} could not be read as layers (and a module)")
                continue
            per_module = _moe_modules(m, {module: set(layers) for module in modules}) if kind == "op_swap" else {
                None: layers}
            for module, module_layers in per_module.items():
                out.append({"layers": specs(module_layers)} if module is None
                           else {"op_name": module, "layers": specs(module_layers)})
            if "backward_prefetch" in item:
                m.line((*path, "backward_prefetch"), "dropped" if item["backward_prefetch"] != sw.get(
                    "default_prefetch", 1) else "unneeded", "mf uses one look-ahead for every item: swap.default_prefetch")
            m.src.mark(path)
        if out:
            m.set(f"swap.{kind}", out)
            m.line((*SW, kind), "translated", f"swap.{kind}: {out} (layer indices as layer specs)", mark=False)
        elif not isinstance(items, list):
            m.dropped((*SW, kind), "must be a list of items")
    if sw.get("layer_swap") is None and sw.get("op_swap") is None:
        if every is None:
            m.action((*SW, "swap"), "MindFormers' default offloads flash attention in every layer: set swap.op_swap "
                                    "by hand (the layer count is unknown)")
        else:
            m.set("swap.op_swap", [{"op_name": "attention", "layers": specs(every)}])
            m.line((*SW, "swap"), "translated", "MindFormers' default offloads flash attention in every layer: "
                   f"swap.op_swap [{{op_name: attention, layers: {specs(every)}}}]", mark=False)
