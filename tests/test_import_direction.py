"""The import direction flows -> tasks -> nip_core holds (ruff's TID251 covers nip_core)."""

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
