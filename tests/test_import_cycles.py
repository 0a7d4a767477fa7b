"""No two modules of trajkit import each other, directly or around a circle, when they are imported.

An import circle works only as long as every module on it happens to need the others' names late;
one new ``from x import y`` at the top of the wrong module and the package no longer imports. The
graph here is of the imports a module runs when it is imported: its top-level statements (also
inside ``try`` or a plain ``if``), not those inside functions, nor those under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_PACKAGES = ("trajkit_docker", "trajkit_singularity", "trajkit_modal", "trajkit_ray", "trajkit_atropos")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run when the module is imported: into blocks, not into functions."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.If):
            if not is_type_checking(node.test):
                yield from import_time_statements(node.body)
            yield from import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from import_time_statements(block)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from import_time_statements(node.body)
        else:
            yield node


def imported(module: str, is_package: bool, tree: ast.Module, known: set[str]) -> set[str]:
    """The modules of ``known`` that importing ``module`` imports first, its own packages aside."""
    targets: set[str] = set()
    needed: set[str] = set()
    for node in import_time_statements(tree.body):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            targets.add(base)
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            targets.update(submodules)
            if len(submodules) < len(node.names):
                needed.add(base)  # a name defined by the module itself: it must have run first
    own = {module.rsplit(".", n)[0] for n in range(module.count(".") + 1)}
    edges = needed & known - {module}
    for target in targets:
        parts = target.split(".")
        # importing a.b.c runs a, a.b and a.b.c: those the importer is not itself inside
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            if name in known and name not in own:
                edges.add(name)
    return edges


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    paths = {module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}
    known = set(paths)
    return {
        name: imported(name, path.name == "__init__.py", ast.parse(path.read_text(), str(path)), known)
        for name, path in paths.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or one importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # iterative Tarjan: (node, iterator over its successors)
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize(
    ("root", "package"),
    [
        (ROOT, "trajkit"),
        *((ROOT / name / "src", name) for name in PLUGIN_PACKAGES),
    ],
)
def test_no_module_imports_itself_around_a_circle(root: Path, package: str) -> None:
    graph = import_graph(root, package)
    assert len(graph) > 5
    found = circles(graph)
    described = [" | ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in found]
    assert described == []


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        # a -> b -> a at import time: found
        ({"a.py": "import pkg.b\n", "b.py": "from pkg import a\n"}, [["pkg.a", "pkg.b"]]),
        # the same circle closed only inside a function or under TYPE_CHECKING: not a circle
        ({"a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg import a\n"}, []),
        (
            {
                "a.py": "import pkg.b\n",
                "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n",
            },
            [],
        ),
        # a package whose __init__ imports a module that imports the package's name back
        ({"__init__.py": "from pkg.c import f\n", "c.py": "from pkg import hookimpl\n"}, [["pkg", "pkg.c"]]),
        # a module importing its own package's __init__ implicitly is no circle
        (
            {"__init__.py": "", "sub/__init__.py": "", "sub/d.py": "from pkg.sub import e\n", "sub/e.py": ""},
            [],
        ),
        # a relative import counts like an absolute one
        ({"a.py": "from . import b\n", "b.py": "from .a import X\n"}, [["pkg.a", "pkg.b"]]),
    ],
)
def test_the_circle_check_can_fail(
    tmp_path: Path, sources: dict[str, str], expected: list[list[str]]
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in sources.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert circles(import_graph(tmp_path, "pkg")) == expected
