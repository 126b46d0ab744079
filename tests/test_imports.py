"""The package's import structure: every module imports on its own in a fresh interpreter
(no cycle hides behind import order), and imports, lazy ones included, form no cycle."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "flashinfer"


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "data" in path.relative_to(PACKAGE).parts:
            continue
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _imports(module: str) -> set[str]:
    """flashinfer modules that ``module`` imports anywhere (at import time, in functions,
    under ``if TYPE_CHECKING``), resolved to module names."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    known = set(_modules())
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("flashinfer"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if not target.startswith("flashinfer"):
                continue
            for alias in node.names:  # ``from . import x`` imports the submodule x
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != module}


def test_imports_form_no_cycle() -> None:
    graph = {m: _imports(m) for m in _modules()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module)


FORKED_IMPORTS = """
import os, sys, traceback
import torch, tvm_ffi  # third-party imports are shared; flashinfer's own are not
failed = 0
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__(module)
        except BaseException:
            print(module + ": " + traceback.format_exc().strip().splitlines()[-1], flush=True)
            os._exit(1)
        os._exit(0)
    failed += os.waitpid(pid, 0)[1] != 0
sys.exit(1 if failed else 0)
"""


def test_every_module_imports_alone_in_a_fresh_interpreter() -> None:
    """Each module is imported first in a process of its own (forked from one that holds
    torch, so the run stays fast): no flashinfer module is loaded before it."""
    proc = subprocess.run(
        [sys.executable, "-c", FORKED_IMPORTS, *_modules()],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
