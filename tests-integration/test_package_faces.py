"""The package faces that load MindSpore's parts on first use (PEP 562 `__getattr__` over `_LAZY`):
every lazy name is also imported under `TYPE_CHECKING`, from the module `_LAZY` names, so readers
and type checkers see it; every `__all__` name resolves; and the faces that no-MindSpore paths
import (`mf config validate`, `mf plan`) still import without MindSpore."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys

import pytest

LAZY_FACES = ["mf_parallel", "mf_parallel.pipeline", "mf_models", "mf_trainer"]


def _type_checking_imports(face) -> dict[str, tuple[str, str]]:
    """{bound name: (module, attribute)} of the face's `if TYPE_CHECKING:` block."""
    tree = ast.parse(inspect.getsource(face))
    blocks = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    assert len(blocks) == 1, f"{face.__name__}: one `if TYPE_CHECKING:` block expected"
    out = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom), ast.unparse(node)
        module = importlib.util.resolve_name("." * node.level + (node.module or ""), face.__name__)
        for alias in node.names:
            out[alias.asname or alias.name] = (module, alias.name)
    return out


def _lazy_table(face) -> dict[str, tuple[str, str]]:
    """`_LAZY` as {name: (module, attribute)} (mf_models' values are (module, attribute) pairs,
    the others' a module whose attribute of the same name is taken)."""
    out = {}
    for name, target in face._LAZY.items():
        module, attr = target if isinstance(target, tuple) else (target, name)
        out[name] = (f"{face.__name__}.{module}", attr)
    return out


@pytest.mark.parametrize("name", LAZY_FACES)
def test_the_lazy_names_are_the_type_checking_imports(name):
    face = importlib.import_module(name)
    static = _type_checking_imports(face)
    assert static == _lazy_table(face)
    assert static.keys() <= set(face.__all__), "a lazy name missing from __all__"


@pytest.mark.parametrize("name", LAZY_FACES)
def test_every_exported_name_resolves_to_what_type_checkers_see(name):
    face = importlib.import_module(name)
    static = _type_checking_imports(face)
    assert len(face.__all__) == len(set(face.__all__)), "a name listed twice in __all__"
    for n in face.__all__:
        assert n in static or n in vars(face), f"{name}.{n}: in __all__, neither imported nor lazy"
        value = getattr(face, n)
        if n in static:
            module, attr = static[n]
            assert value is getattr(importlib.import_module(module), attr), n
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        face.no_such_name  # noqa: B018


@pytest.mark.parametrize("name", LAZY_FACES)
def test_the_face_imports_without_mindspore(name):
    code = (f"import sys, {name}\n"
            f"assert 'mindspore' not in sys.modules, sorted(m for m in sys.modules if m.startswith('mf_'))\n")
    subprocess.run([sys.executable, "-c", code], check=True)
