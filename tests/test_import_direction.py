"""The import direction flows -> tasks -> nip_core holds (ruff's TID251 covers nip_core), and
inside nip_core its packages stand on floors that import only downwards."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_nip_core_imports_neither_prefect_nor_tasks_nor_flows():
    for path in (REPO / "nip_core").rglob("*.py"):
        bad = imported_top_levels(path) & {"prefect", "tasks", "flows"}
        assert not bad, f"{path} imports {bad}"


def test_tasks_never_import_flows():
    for path in (REPO / "tasks").rglob("*.py"):
        assert "flows" not in imported_top_levels(path), path


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for top in ("nip_core", "tasks", "flows")
        for p in (REPO / top).rglob("*.py")
    }


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Project modules `path` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            candidates = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_import_cycles_are_found():
    assert import_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    modules = project_modules()
    graph = {name: imported_modules(path, set(modules)) - {name} for name, path in modules.items()}
    assert import_cycles(graph) == []


def nip_core_imports(package: str) -> dict[str, set[str]]:
    """Module of `nip_core.<package>` -> the other `nip_core` packages (or top-level modules)
    it imports, e.g. {"nip_core.agents", "nip_core"}."""
    modules = project_modules()
    prefix = f"nip_core.{package}"
    found = {}
    for name, path in modules.items():
        if name == prefix or name.startswith(prefix + "."):
            imported = {".".join(m.split(".")[:2]) for m in imported_modules(path, set(modules))}
            found[name] = {m for m in imported if m.startswith("nip_core") and m != prefix}
    return found


def test_package_imports_are_found():
    assert nip_core_imports("lm_server")["nip_core.lm_server.engines.dummy"] == {
        "nip_core.model_api"
    }
    assert nip_core_imports("agents")["nip_core.agents.dummy_client"] >= {"nip_core.model_api"}


def test_the_language_model_server_stands_alone():
    """The server is a product of its own (a separate process, its own CLI): it imports neither
    the agents (its clients) nor the run package (the pipeline's folders), only what both
    sides of the API share (`model_api`) and the pure `seeding` helpers."""
    allowed = {"nip_core", "nip_core.model_api", "nip_core.seeding"}
    for name, imported in nip_core_imports("lm_server").items():
        assert imported <= allowed, f"{name} imports {imported - allowed}"


def test_the_shared_model_api_and_the_parameters_sit_at_the_bottom():
    """`model_api` lies below both the clients and the server; the configuration API imports
    nothing above it (training imports parameters, so the arrow must never run back up)."""
    for name, imported in nip_core_imports("model_api").items():
        assert not imported, f"{name} imports {imported}"
    allowed = {"nip_core", "nip_core.model_api"}
    for name, imported in nip_core_imports("parameters").items():
        assert imported <= allowed, f"{name} imports {imported - allowed}"


# nip_core's floors, top to bottom (docs/architecture.md draws them): a package imports only
# packages on the floors below its own, never one beside it or above it; imports inside
# functions count. The language-model server stands apart (the test above).
NIP_CORE_FLOORS: tuple[tuple[str, ...], ...] = (
    ("experiment",),  # the learning experiment: arms, verdict scores, summary
    ("training",),  # model groups, fine-tune jobs, the switch guard
    ("play", "report"),  # playing episodes (rollout and evaluation stages); reading a run
    ("malt",),  # tree growth, rewards, pairs, export, statistics, evaluation
    ("agents", "run"),  # prompts, parsing and chat clients; run folders and manifests
    ("data", "protocols"),  # datasets, splits and the sandbox; the six protocols
    ("parameters",),  # the configuration API
    ("episode", "model_api", "seeding"),  # shared records, the API's shared parts, seeds
)
STANDS_APART = {"lm_server": {"model_api", "seeding"}}


def allowed_imports() -> dict[str, set[str]]:
    """Each nip_core package (or top-level module) -> the nip_core packages it may import."""
    allowed = {}
    for level, floor in enumerate(NIP_CORE_FLOORS):
        below = {name for lower in NIP_CORE_FLOORS[level + 1 :] for name in lower}
        allowed.update({name: below for name in floor})
    return allowed | STANDS_APART


def test_every_nip_core_package_has_a_floor():
    here = {p.parent.name for p in (REPO / "nip_core").glob("*/__init__.py")}
    here |= {p.stem for p in (REPO / "nip_core").glob("*.py") if p.name != "__init__.py"}
    assert here == set(allowed_imports()), here ^ set(allowed_imports())


def test_nip_core_packages_import_only_the_floors_below():
    """The layers contract: no arrow sideways or back up (`malt.evaluation` once reached up into
    `experiment.stats` from inside a function; the bootstrap now lives in `malt.bootstrap`)."""
    wrong = []
    for package, allowed in allowed_imports().items():
        for module, imported in sorted(nip_core_imports(package).items()):
            above = {m.removeprefix("nip_core.") for m in imported} - allowed - {"nip_core"}
            wrong += [f"{module} imports nip_core.{name}" for name in sorted(above)]
    assert not wrong, "\n".join(wrong)


def test_nip_core_has_no_relative_imports():
    """Relative imports would slip past the scans above."""
    for path in (REPO / "nip_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path}:{node.lineno}"


def test_flows_share_only_the_cli_and_the_pipeline():
    """Entry-point flows are not a library: they import flows.cli / flows.pipeline only (the
    `serve` command, which registers the flows as deployments, is the one exception);
    flows.cli starts the self-hosted server through flows.lm_server."""
    shared = {"flows", "flows.cli", "flows.pipeline", "flows.prefect_defaults", "flows.lm_server"}
    modules = project_modules()
    for name, path in modules.items():
        if not name.startswith("flows.") or name == "flows.serve":
            continue
        other_flows = {m for m in imported_modules(path, set(modules)) if m.startswith("flows")}
        assert other_flows <= shared, f"{name} imports {other_flows - shared}"


# Prefect plumbing beside the task modules, no stage and no task: the retry policy
# (`tasks/__init__.py`) and the Prefect UI's artifacts and progress bars.
TASK_HELPERS = {"tasks", "tasks.prefect_ui"}


def _called_name(node: ast.expr) -> str | None:
    """The name a call expression calls (`f(...)` -> "f", `module.f(...)` -> "module")."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id
    return func.id if isinstance(func, ast.Name) else None


def _imported_from(tree: ast.Module) -> dict[str, str]:
    """Name -> the module it was imported from."""
    return {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def _task_body_problem(function: ast.FunctionDef, origins: dict[str, str]) -> str | None:
    """Why a task's body is more than its decorator over one library call (None: it is not):
    a docstring, then `return stage(...)` of a function from nip_core, optionally inside one
    `with progress(...) as p:` of `tasks.prefect_ui`."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) == 1 and isinstance(body[0], ast.With):
        (item,) = body[0].items
        if origins.get(_called_name(item.context_expr)) != "tasks.prefect_ui":
            return "its `with` is not a progress reporter of tasks.prefect_ui"
        body = body[0].body
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return "its body is more than `return <one library call>`"
    origin = origins.get(_called_name(body[0].value)) or ""
    if not origin.startswith(("nip_core.", "tasks.prefect_ui")):
        return f"it returns no call of a library function (called from {origin or '?'})"
    return None


def _task_statement_problem(node: ast.stmt, origins: dict[str, str]) -> str | None:
    """Why a top-level statement of a task module is more than a task over one library
    function (None: it is one): `name = task(library_function, ...)`, or a `@task` function
    whose body returns one library call, optionally inside a progress reporter."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if [_called_name(d) for d in node.decorator_list] != ["task"]:
            return f"{node.name} is no task"
        return _task_body_problem(node, origins)
    if isinstance(node, ast.Assign):
        call = node.value
        if _called_name(call) != "task" or not call.args or not isinstance(call.args[0], ast.Name):
            return "a module-level assignment that is not `task(library_function, ...)`"
        origin = origins.get(call.args[0].id) or ""
        if not origin.startswith(("nip_core.", "tasks.prefect_ui")):
            return f"task({call.args[0].id}) wraps no library function"
        return None
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return None
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return None  # the docstring
    return f"a {type(node).__name__} statement: stage logic belongs in nip_core"


def test_tasks_are_decorators_over_one_library_function_each():
    """No stage logic in tasks/ (issue: a stage lived in three places): a task module holds
    Prefect tasks over one library function each (`task(function, name=...)`, or a `@task`
    whose body returns that function's result inside a progress reporter) and nothing else;
    the helper modules define no task."""
    for path in sorted((REPO / "tasks").glob("*.py")):
        name = f"tasks.{path.stem}" if path.stem != "__init__" else "tasks"
        tree = ast.parse(path.read_text())
        if name in TASK_HELPERS:
            functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
            tasks = [f.name for f in functions if "task" in map(_called_name, f.decorator_list)]
            assigned = [n for n in tree.body if isinstance(n, ast.Assign)]
            assert not tasks and not any(_called_name(a.value) == "task" for a in assigned), path
            continue
        origins = _imported_from(tree)
        statements = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
        assert len(statements) > 1, f"{path} defines no Prefect task"
        for node in statements:
            problem = _task_statement_problem(node, origins)
            assert problem is None, f"{path}:{node.lineno}: {problem}"


def test_task_modules_import_no_other_task_module():
    modules = project_modules()
    for name, path in modules.items():
        if not name.startswith("tasks.") or name in TASK_HELPERS:
            continue
        other_tasks = {
            m for m in imported_modules(path, set(modules)) if m.split(".")[0] == "tasks"
        }
        assert other_tasks <= TASK_HELPERS, f"{name} imports {other_tasks - TASK_HELPERS}"


def test_nip_core_top_level_holds_packages_and_few_tiny_modules():
    modules = [p for p in (REPO / "nip_core").glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 3, modules
    for path in modules:
        assert path.read_text().count("\n") <= 60, f"{path} is not tiny"


def test_files_and_functions_stay_short():
    for top in ("nip_core", "tasks", "flows"):
        for path in (REPO / top).rglob("*.py"):
            text = path.read_text()
            assert text.count("\n") <= 400, f"{path}: {text.count(chr(10))} lines"
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    assert length <= 60, f"{path}:{node.lineno} {node.name}: {length} lines"
