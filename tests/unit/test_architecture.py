"""The house rules of the code, checked so that a change that breaks one fails the build:

- the layers of pyproject.toml's import-linter contracts hold (cli -> app -> sweeps -> reports ->
  runtime -> store -> experiment -> core; reports import nothing of ablation; the CLI imports
  only the app layer);
- no import cycle exists between our modules, counting imports inside functions and under
  TYPE_CHECKING (so no in-function import can hide one);
- no function is over 60 lines, no signature over 7 parameters (``self`` / ``cls`` not counted),
  outside the few listed below with their reason.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT


PACKAGES = ("core", "ablation", "sweeps", "reports", "cli")
MAX_LINES, MAX_PARAMS = 60, 7

# (module path, function): why its signature may be longer
SIGNATURE_EXCEPTIONS = {
    ("core/algorithms.py", "clipped_policy_loss"): "the documented math API (docs/contracts.md: the math API), 8 parameters",
    ("cli/report_cmd.py", "report"): "a Typer command: its parameters are the command's options",
    ("cli/plan_seeds_cmd.py", "plan_seeds"): "a Typer command: its parameters are the command's options",
    ("cli/train_cmd.py", "train"): "a Typer command: its parameters are the command's options",
}


def _functions(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    count = len(names) + bool(args.vararg) + bool(args.kwarg)
    return count - (1 if names and names[0] in ("self", "cls") else 0)


def test_no_function_is_over_60_lines_or_7_parameters():
    too_long, too_wide = [], []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            for node in _functions(path):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    too_long.append(f"{relative}:{node.lineno} {node.name} ({lines} lines)")
                if _params(node) > MAX_PARAMS and (relative, node.name) not in SIGNATURE_EXCEPTIONS:
                    too_wide.append(f"{relative}:{node.lineno} {node.name} ({_params(node)} parameters)")
    assert not too_long, f"functions over {MAX_LINES} lines: {too_long}"
    assert not too_wide, f"signatures over {MAX_PARAMS} parameters (use an options dataclass): {too_wide}"


def test_the_size_check_counts_what_it_should(tmp_path: Path):
    path = tmp_path / "m.py"
    path.write_text("class A:\n    def f(self, a, b, c, d, e, f, g, *, h): pass\n\ndef g(*args, **kwargs): pass\n")
    counts = {node.name: _params(node) for node in _functions(path)}
    assert counts == {"f": 8, "g": 2}


def test_no_import_cycle_between_our_modules():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(*(f"dapo_ablate.{p}" for p in PACKAGES), include_external_packages=False)
    cycles = _cycles(graph)
    assert not cycles, f"import cycles (imports inside functions and TYPE_CHECKING count): {cycles}"


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_the_layer_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_package_folder_is_listed_for_installation():
    """A wheel (and a non-editable install on a cluster node) holds only the packages pyproject
    lists: a new subpackage missing there works in a checkout and is absent everywhere else."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "dapo_ablate." + ".".join(init.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert found <= listed, f"packages missing from pyproject's [tool.setuptools] packages: {sorted(found - listed)}"


def _shadowed(tree: ast.Module) -> list[str]:
    """Names a module imports and then defines again at its top level (a def, a class or an
    assignment): the later one silently replaces the import for every use in the module."""
    imported = {alias.asname or alias.name.split(".")[0] for node in tree.body
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}  # fmt: skip
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    defined += [target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
                if isinstance(target, ast.Name)]  # fmt: skip
    return sorted(imported & set(defined))


def test_no_module_redefines_a_name_it_imports():
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
        for name in _shadowed(ast.parse(path.read_text(), str(path)))
    ]  # fmt: skip
    assert not found, f"an import replaced by a definition of the same name: {found}"


def test_the_shadowing_check_sees_a_def_over_an_import():
    tree = ast.parse("from x import metric_column, y as z\n\ndef metric_column(): pass\nz = 1\nw = 2\n")
    assert _shadowed(tree) == ["metric_column", "z"]


# Where the backend's name may be compared with a string: the registry (one `Backend` per name) and
# the config's own rule below it (core cannot import the registry).
BACKEND_NAME_TESTS_ALLOWED = {
    ("ablation/runtime/backends/registry.py", None): "the registry: one Backend per TrainerConfig.backend literal",
    ("core/config.py", "trains_here"): "the config's own validators, in core below the registry",
}
BACKEND_NAMES = ("builtin", "verl")


def _mentions_backend(node: ast.AST) -> bool:
    """`x.backend`, `x["backend"]`, `x.get("backend")` or a name `backend`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "backend"
    if isinstance(node, ast.Name):
        return node.id == "backend"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "backend"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "backend"
    return False


def _names_a_backend(node: ast.AST) -> bool:
    """A string literal naming a backend, or a tuple, list or set of them."""
    if isinstance(node, ast.Constant):
        return node.value in BACKEND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_backend(element) for element in node.elts)
    return False


def _backend_name_tests(tree: ast.Module) -> list[tuple[int, str | None]]:
    """(line, enclosing function) of each comparison of a backend with a name: ``config.backend ==
    "verl"``, ``config.get("backend") in ("builtin", "verl")``, and any comparison with ``"verl"``."""
    found = []
    for function in [None, *(node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        nodes = ast.walk(function) if function is not None else (
            node for top in tree.body if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for node in ast.walk(top))  # fmt: skip
        for node in nodes:
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            verl = any(isinstance(o, ast.Constant) and o.value == "verl" for o in operands)
            if verl or (any(map(_mentions_backend, operands)) and any(map(_names_a_backend, operands))):
                found.append((node.lineno, function.name if function is not None else None))
    return sorted(set(found))


def test_the_backend_is_chosen_through_its_registry_not_by_comparing_its_name():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if (relative, None) in BACKEND_NAME_TESTS_ALLOWED:
                continue
            for line, function in _backend_name_tests(ast.parse(path.read_text(), str(path))):
                if (relative, function) not in BACKEND_NAME_TESTS_ALLOWED:
                    found.append(f"{relative}:{line}")
    assert not found, ("the backend's name compared with a string outside ablation/runtime/backends/registry.py "
                       f"(look the Backend up with backend_of(config) and ask it instead): {found}")


def test_the_backend_name_check_sees_each_form():
    source = '''
def f(config, spec, run):
    if config.backend == "verl": pass
    if config.get("backend") != "builtin": pass
    if spec["backend"] in ("builtin", "verl"): pass
    if "verl" == run.name: pass
    if config.model.path == "builtin": pass
    if backend_of(config).runs_as_job: pass
'''
    assert [line for line, _ in _backend_name_tests(ast.parse(source))] == [3, 4, 5, 6]


# A scheduler says what differs between designs; whatever watches or logs the runs (the console
# display, MLflow) is a listener of the one driver's events (ablation/runtime/driver.py).
SCHEDULER_MODULES = ("ablation/runtime/factorial.py", "ablation/runtime/adaptive.py", "sweeps/scheduler.py")
LISTENER_MODULES = ("mlflow", "rich", "dapo_ablate.ablation.store.tracking", "dapo_ablate.ablation.runtime.mlflow_runs",
                    "dapo_ablate.ablation.runtime.run_display", "dapo_ablate.ablation.runtime.progress",
                    "dapo_ablate.sweeps.display", "dapo_ablate.sweeps.tracking")
SCHEDULER_METHODS = 6
"""The most methods the `Scheduler` protocol may ask of a design."""


def _imported(tree: ast.Module) -> set[str]:
    """Every module `tree` imports, at any depth (in functions and under TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_schedulers_import_neither_mlflow_nor_the_display():
    found = []
    for relative in SCHEDULER_MODULES:
        imported = _imported(ast.parse((ROOT / relative).read_text(), relative))
        found += [f"{relative}: {name}" for name in sorted(imported)
                  if any(name == banned or name.startswith(banned + ".") for banned in LISTENER_MODULES)]
    assert not found, f"a scheduler imports what a driver's listener does (make it a RunListener): {found}"


def test_the_scheduler_import_check_sees_each_form():
    tree = ast.parse("import mlflow.client\nfrom rich.progress import Progress\ndef f():\n"
                     "    from dapo_ablate.ablation.store import tracking\n")
    imported = _imported(tree)
    assert {"mlflow.client", "rich.progress", "dapo_ablate.ablation.store.tracking"} <= imported


def test_the_scheduler_protocol_asks_only_what_differs_between_designs():
    tree = ast.parse((ROOT / "ablation/runtime/driver.py").read_text())
    (protocol,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Scheduler"]
    methods = [node.name for node in protocol.body if isinstance(node, ast.FunctionDef)]
    assert 3 <= len(methods) <= SCHEDULER_METHODS, methods
    assert {"next_run", "on_outcome", "finished"} <= set(methods)
    (listener,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "RunListener"]
    events = {node.name for node in listener.body if isinstance(node, ast.FunctionDef)}
    assert not events & set(methods), "a scheduler that listens (a sweep's) would hear a listener's event as its own call"


def test_the_answer_run_and_status_print_loads_without_the_report_pages_code():
    """`run` and `status` print the answer (`reports.answer`, through the app's commands); the
    page and its figures (`reports.report`, `reports.plots`, matplotlib) load only for `report`:
    a fresh interpreter importing the commands' modules has none of them."""
    code = ("import sys, dapo_ablate.ablation.app.experiment, dapo_ablate.ablation.app.report, dapo_ablate.reports.answer; "
            "print(sorted(m for m in ('matplotlib', 'dapo_ablate.reports.report', 'dapo_ablate.reports.plots') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded
