"""Result lines the dist workers print and the tests read: `RESULT {"name": ..., "ok": ..., ...}`."""

from __future__ import annotations

import json
import traceback

PREFIX = "RESULT "


def emit(name: str, ok: bool, detail: str = "", **extra) -> None:
    print(PREFIX + json.dumps({"name": name, "ok": bool(ok), "detail": detail, **extra}), flush=True)


def run_check(name: str, fn, *args) -> None:
    """Run `fn(*args) -> (ok, detail)`; an exception is a failed check with its traceback."""
    try:
        ok, detail = fn(*args)
    except Exception as exc:  # a failing check must not stop the others
        ok, detail = False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
    emit(name, ok, detail)


def parse(log_text: str) -> list[dict]:
    out = []
    for line in log_text.splitlines():
        idx = line.find(PREFIX)
        if idx >= 0:
            try:
                out.append(json.loads(line[idx + len(PREFIX):]))
            except json.JSONDecodeError:
                continue
    return out
