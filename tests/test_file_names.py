"""Every artifact file name of a run folder is spelled once, in `nip_core/run/iteration_files.py`."""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A file name in a string literal (or the literal part of an f-string): `x.parquet`, `-nodes.jsonl`.
FILE_NAME = re.compile(r"[\w\-./{}]+\.(parquet|jsonl|json|html)$")
NOT_ARTIFACTS = {
    "nip_core/run/iteration_files.py",  # where they are spelled
    "nip_core/agents/call_journal.py",  # the journal's own segment files beside its path
    "nip_core/training/model_groups.py",  # the name a dataset is uploaded under
    "nip_core/parameters/loading.py",  # configuration files, read by suffix
}
NOT_ARTIFACT_PACKAGES = (
    "nip_core/lm_server/",  # a product of its own, with its own state folder
    "nip_core/data/",  # the input data sets
)


def spelled_file_names(path: Path) -> list[str]:
    """The string literals of `path` that end in a file name; an f-string is read whole, its
    fields as `{}` (so `f"{stem}.parquet"` counts, `n.endswith(".parquet")` does not)."""
    tree = ast.parse(path.read_text())
    parts = {
        id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values
    }
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            texts.append(
                "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            )
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts
        ):
            texts.append(node.value)
    return [text for text in texts if FILE_NAME.search(text)]


def test_file_names_in_literals_are_found(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text(
        'a = f"{stem}-nodes.parquet"\nb = "x/y.json"\nc = n.endswith(".parquet")\n'
        'd = f"shards/{i:05d}.jsonl"\n'
    )
    assert sorted(spelled_file_names(sample)) == ["shards/{}.jsonl", "x/y.json", "{}-nodes.parquet"]


def test_artifact_file_names_are_spelled_only_in_iteration_files():
    found = {}
    for top in ("nip_core", "tasks", "flows"):
        for path in (REPO / top).rglob("*.py"):
            name = path.relative_to(REPO).as_posix()
            if name in NOT_ARTIFACTS or name.startswith(NOT_ARTIFACT_PACKAGES):
                continue
            if spelled := spelled_file_names(path):
                found[name] = spelled
    assert found == {}
