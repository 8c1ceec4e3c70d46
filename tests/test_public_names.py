"""Every public name means one thing: no two modules of nip_core, tasks or flows define a public
(no leading underscore) top-level class or function under the same name. The `main` of each
command-line module is the one name they may share; a command's argument parser is private.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("nip_core", "tasks", "flows")
SHARED_BY_COMMANDS = {"main"}
Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def top_level_definitions(statements: list[ast.stmt]) -> list[Definition]:
    """Classes and functions a module defines at its top level, also under a top-level `if`
    or `try` (a definition that depends on a version or an optional import)."""
    found = []
    for node in statements:
        if isinstance(node, Definition):
            found.append(node)
        elif isinstance(node, ast.If):
            found += top_level_definitions(node.body) + top_level_definitions(node.orelse)
        elif isinstance(node, ast.Try):
            blocks = [node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)]
            found += [d for block in blocks for d in top_level_definitions(block)]
    return found


def public_definitions(root: Path, packages=PACKAGES) -> dict[str, list[str]]:
    """Public top-level name -> the `path:line` of every module that defines it."""
    where = defaultdict(list)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in top_level_definitions(ast.parse(path.read_text()).body):
                if not node.name.startswith("_") and node.name not in SHARED_BY_COMMANDS:
                    where[node.name].append(f"{path.relative_to(root)}:{node.lineno}")
    return dict(where)


def duplicated(where: dict[str, list[str]]) -> dict[str, list[str]]:
    """The names defined in more than one module (a name defined twice in one module is a
    redefinition that ruff's F811 reports)."""
    return {
        name: places
        for name, places in sorted(where.items())
        if len({p.rsplit(":", 1)[0] for p in places}) > 1
    }


def test_duplicates_are_found(tmp_path):
    (tmp_path / "nip_core" / "sub").mkdir(parents=True)
    (tmp_path / "flows").mkdir()
    (tmp_path / "nip_core" / "a.py").write_text(
        "class Error(Exception): ...\ndef read(): ...\ndef main(): ...\ndef _helper(): ...\n"
    )
    (tmp_path / "nip_core" / "sub" / "b.py").write_text(
        "try:\n    import x\nexcept ImportError:\n    class Error(ValueError): ...\n"
        "def main(): ...\ndef _helper(): ...\ndef other():\n    def read(): ...\n"
    )
    (tmp_path / "flows" / "c.py").write_text("if True:\n    async def read(): ...\n")
    found = duplicated(public_definitions(tmp_path, ("nip_core", "flows")))
    assert found == {
        "Error": ["nip_core/a.py:1", "nip_core/sub/b.py:4"],
        "read": ["nip_core/a.py:2", "flows/c.py:2"],
    }


def test_no_public_name_is_defined_twice():
    found = duplicated(public_definitions(REPO))
    listing = "\n".join(f"  {name}: {', '.join(places)}" for name, places in found.items())
    assert not found, f"public names defined in more than one module:\n{listing}"
