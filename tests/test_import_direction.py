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


def test_every_tasks_module_defines_a_task():
    for path in (REPO / "tasks").glob("*.py"):
        if path.name != "__init__.py":
            assert "@task(" in path.read_text(), f"{path} defines no Prefect task"


# Shared by the stage modules: the retry policy (`tasks/__init__.py`) and the Prefect artifacts.
TASK_HELPERS = {"tasks", "tasks.prefect_artifacts"}


def test_stage_modules_in_tasks_are_thin_wrappers():
    """A stage module reads its inputs, calls `nip_core` and records the stage: under 90 lines,
    and it imports no other stage module (only the shared helpers)."""
    modules = project_modules()
    for name, path in modules.items():
        if not name.startswith("tasks.") or name in TASK_HELPERS:
            continue
        lines = path.read_text().count("\n")
        assert lines < 90, f"{path}: {lines} lines, a stage's logic belongs in nip_core"
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
