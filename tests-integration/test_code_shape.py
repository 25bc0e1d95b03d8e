"""Inside each package: no import circle between modules, and no module importing another module's
`_private` name (issue 29 removed them; a shared helper gets a public name, or moves to the module
both sides can import). Read from the source with `ast`, so nothing is imported."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[1] / "packages"

# What stays, and why. Each entry names its way out; delete it when that lands.
KNOWN_CIRCLES: list[set[str]] = []   # none left (issue 29's layout removed the last one)
KNOWN_PRIVATE = {
    ("mf_data.helpers", "mf_data._chelpers"),   # the wrapper of its own compiled extension
}


def _modules() -> dict[str, Path]:
    out = {}
    for src in sorted(PACKAGES.glob("*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(modules: dict[str, Path]):
    """{module: set of modules it imports (anywhere in its body)}, and [(module, "where:name")]
    for each `_private` name it takes from another module."""
    edges, private = {}, []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        bound = {}                              # local name -> module, for `module._name` uses
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.add(alias.name)
                    if alias.asname:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in modules:
                        found.add(full)
                        bound[alias.asname or alias.name] = full
                    else:
                        found.add(base)
                        if alias.name.startswith("_") and not alias.name.startswith("__") and base != name:
                            private.append((name, f"{base}:{alias.name}"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and bound.get(node.value.id) in modules
                    and bound[node.value.id] != name):
                private.append((name, f"{bound[node.value.id]}.{node.attr}"))
        targets = set()
        for target in found:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            # the package's own faces (a parent re-exporting its children) are not circles
            if target and target != name and target.split(".")[0] == name.split(".")[0] \
                    and not name.startswith(target + ".") and not target.startswith(name + "."):
                targets.add(target)
        edges[name] = targets
    return edges, private


def _circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(group)

    for v in edges:
        if v not in index:
            visit(v)
    return out


@functools.cache
def _packages_read():
    return _imports(_modules())


def test_no_import_circles_inside_a_package():
    edges, _ = _packages_read()
    circles = [c for c in _circles(edges) if c not in KNOWN_CIRCLES]
    assert not circles, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in circles)


def test_no_private_names_across_modules():
    _, private = _packages_read()
    found = sorted({(m, t) for m, t in private if (m, t.replace(":", ".")) not in KNOWN_PRIVATE})
    assert not found, "private names used by other modules: " + "; ".join(f"{m} -> {t}" for m, t in found)


def test_the_checks_see_a_circle_and_a_private_import(tmp_path, monkeypatch):
    """The reader itself: two modules importing each other, one taking the other's `_name`."""
    src = tmp_path / "pkg" / "src" / "mfx"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "a.py").write_text("from .b import helper\n")
    (src / "b.py").write_text("def helper():\n    from mfx import a\n    return a._secret\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", tmp_path)
    edges, private = _imports(_modules())
    assert _circles(edges) == [{"mfx.a", "mfx.b"}]
    assert private == [("mfx.b", "mfx.a._secret")]
