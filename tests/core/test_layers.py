"""The layers, read from the import graph: core <- integrations <- tools <- cli.

A module may import from its own layer and the layers below it, never above. Every
import counts, also one inside a function or under ``TYPE_CHECKING``: a lazy import
still ties the lower layer to the upper one.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import deadlines

PACKAGE = Path(deadlines.__file__).parent
LAYERS = ("core", "integrations", "tools", "cli")
#: The tools: each its own package, the command line's rules they follow and what they share.
TOOLS = {"lab", "sim", "plan", "audit", "_cli", "_tools"}
#: The core's public modules besides the package itself (the rest are `_private`).
CORE_PUBLIC = {"wire", "testing"}


def layer(module: str) -> str:
    """The layer of `module` (a dotted name under `deadlines`)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "core"
    top = parts[1]
    if top == "__main__":
        return "cli"
    if top in TOOLS:
        return "tools"
    if top.startswith("_") or top in CORE_PUBLIC:
        return "core"
    return "integrations"


def module_name(path: Path) -> str:
    """The dotted name of the module in `path` under the package."""
    parts = ("deadlines", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(source: str, name: str, *, package: bool, known: set[str]) -> set[str]:
    """The modules in `known` that `source`, the text of module `name`, imports anywhere.

    `package`: whether `name` is a package (its ``__init__.py``), for relative imports.
    """
    parent = name if package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = parent.split(".")[: len(parent.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            found.add(source)
            # `from . import postgres` imports the module deadlines.postgres.
            found.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known)
    return {m for m in found if m in known}


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """Each import in `graph` that reaches a layer above its importer's."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(
        f"{importer} ({layer(importer)}) imports {target} ({layer(target)})"
        for importer, targets in graph.items()
        for target in targets
        if rank[layer(target)] > rank[layer(importer)]
    )


def graph() -> dict[str, set[str]]:
    """The package's import graph: module -> the package's modules it imports."""
    found = modules()
    return {
        name: imports(
            path.read_text(encoding="utf-8"),
            name,
            package=path.name == "__init__.py",
            known=set(found),
        )
        for name, path in found.items()
    }


def test_no_module_imports_a_layer_above_its_own() -> None:
    """core <- integrations <- tools <- cli: no import goes up."""
    assert crossings(graph()) == []


def test_the_check_sees_every_kind_of_import() -> None:
    """A crossing is found in a relative, absolute, lazy or `from . import` import."""
    sources = {
        "from .lab import report": {"deadlines.lab.report"},
        "from . import streams": {"deadlines.streams"},
        "import deadlines.sim.run": {"deadlines.sim.run"},
        "def f():\n    from .plan._latency import Latency": {"deadlines.plan._latency"},
    }
    known = set(modules())
    for source, expected in sources.items():
        found = imports(source, "deadlines._budget", package=False, known=known)
        assert expected <= found, source
        assert crossings({"deadlines._budget": found}), source


def test_every_module_has_a_layer_and_each_layer_has_modules() -> None:
    """The layers are not empty: the check would pass vacuously otherwise."""
    assert {layer(name) for name in modules()} == set(LAYERS)


def loaded(code: str) -> list[str]:
    """The package's modules loaded, in a fresh interpreter, by running `code`."""
    probe = (
        "import sys, json\n"
        f"{code}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'deadlines')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    result: list[str] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_import_deadlines_loads_the_core_only() -> None:
    """`import deadlines` loads no integration, tool or CLI module."""
    names = loaded("import deadlines")
    assert "deadlines._errors" in names
    assert [name for name in names if layer(name) != "core"] == []


@pytest.mark.parametrize("argv", [["--help"], []])
def test_cli_help_loads_the_cli_only(argv: list[str]) -> None:
    """`deadlines --help` loads the CLI on top of the core, no subcommand's module."""
    core = set(loaded("import deadlines"))
    names = loaded(
        "from contextlib import redirect_stdout, suppress\nimport io\n"
        "from deadlines.__main__ import main\n"
        f"with redirect_stdout(io.StringIO()), suppress(SystemExit): main({argv!r})"
    )
    assert set(names) - core == {"deadlines.__main__", "deadlines._cli"}


def test_a_subcommand_loads_its_own_module() -> None:
    """`deadlines plan --help` loads the planner and no other tool."""
    names = loaded(
        "from contextlib import redirect_stdout, suppress\nimport io\n"
        "from deadlines.__main__ import main\n"
        "with redirect_stdout(io.StringIO()), suppress(SystemExit): main(['plan', '--help'])"
    )
    tools = {name.split(".")[1] for name in names if layer(name) == "tools"}
    assert tools == {"plan", "_cli", "_tools"}
