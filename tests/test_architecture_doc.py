"""docs/architecture.md describes the tree as it is.

- Every file or directory it names in backticks exists: a path from the repository's root
  (``tf_dlrm/embedding/``, ``tests/cli/test_config_tf_free.py``) or, in a table row, a file of that row's
  packages (``plan.py`` in the ``tf_dlrm/sharding/`` row, ``layers/`` in ``tf_dlrm/models/``).
- Every dotted name (``tf_dlrm.train.loop_config``) exists, and every class-like name of a row (``DistributedEnv``)
  is defined in a module of that row's packages.
- No package or client has two rows.
- The package table lists tf_dlrm's packages in the layer order ``tests/test_layering.py`` enforces on the
  code, one row per level, and the clients table every top-level client of the library.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from repo_names import REPO, bound_names, dotted_name_exists, parsed, path_exists
from test_layering import LAYERS, clients_of_the_library

PAGE = os.path.join(REPO, "docs", "architecture.md")
TICKED = re.compile(r"`([^`]+)`")
PATH = re.compile(r"[A-Za-z_.][\w.-]*(/[\w.-]*)*")  # not `1/count`
FILE_SUFFIXES = (".py", ".cc", ".sh", ".md", ".yaml", ".json", ".jsonl")
DOTTED = re.compile(r"(tf_dlrm|preprocessing)(\.\w+)+")
CLASS_LIKE = re.compile(r"[A-Z][a-z]\w*[A-Z]\w*|[A-Z][a-z]+")  # DistributedEnv, Model; not NE, AUC, `B`


class Row(NamedTuple):
    table: str  # the header's first cell: "package" or "client"
    line: int
    names: tuple[str, ...]  # the first cell's backticked names
    text: str  # the other cells


def rows_of(text: str) -> list[Row]:
    rows, header = [], None
    for number, line in enumerate(text.split("\n"), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells[0]
        elif not set(cells[0]) <= set("-: "):
            rows.append(Row(header, number, tuple(TICKED.findall(cells[0])), " | ".join(cells[1:])))
    return rows


def is_path(token: str) -> bool:
    return bool(PATH.fullmatch(token)) and ("/" in token or token.endswith(FILE_SUFFIXES))


def row_directories(row: Row) -> list[str]:
    return [name if name.endswith("/") else os.path.dirname(name) + "/" for name in row.names if is_path(name)]


def package_of(name: str) -> str | None:
    """``tf_dlrm/embedding/`` -> ``embedding``, ``tf_dlrm/metrics.py`` -> ``metrics``; None outside tf_dlrm."""
    parts = name.rstrip("/").split("/")
    if parts[0] != "tf_dlrm" or len(parts) != 2:
        return None
    return parts[1][: -len(".py")] if parts[1].endswith(".py") else parts[1]


def defined_in(directories: list[str], name: str) -> bool:
    for directory in directories:
        for folder, _, files in os.walk(os.path.join(REPO, directory)):
            if any(name in bound_names(parsed(os.path.join(folder, f)).body) for f in files if f.endswith(".py")):
                return True
    return False


def missing_names(text: str) -> list[str]:
    """``line: what`` for every path, dotted name or class-like name of the page that does not exist."""
    found = []
    top_level = set(os.listdir(REPO))
    rows = {row.line: row for row in rows_of(text)}
    for number, line in enumerate(text.split("\n"), 1):
        row = rows.get(number)
        for token in TICKED.findall(line):
            if is_path(token):
                if token.split("/")[0] in top_level or row is None:
                    exists = path_exists(token)
                else:
                    exists = any(path_exists(directory + token) for directory in row_directories(row))
                if not exists:
                    where = "the repository" if row is None or token.split("/")[0] in top_level else \
                        " or ".join(row_directories(row))
                    found.append(f"{number}: `{token}` is not in {where}")
            elif DOTTED.fullmatch(token):
                if not dotted_name_exists(token):
                    found.append(f"{number}: `{token}` does not exist")
            elif row is not None and CLASS_LIKE.fullmatch(token) and not defined_in(row_directories(row), token):
                found.append(f"{number}: `{token}` is defined in no module of {' or '.join(row_directories(row))}")
    return found


def repeated_rows(text: str) -> list[str]:
    seen, found = {}, []
    for row in rows_of(text):
        for name in row.names:
            if name in seen:
                found.append(f"{row.line}: `{name}` has a row already (line {seen[name]})")
            seen.setdefault(name, row.line)
    return found


def layer_order(text: str) -> list[str]:
    """What differs between the package table's rows and LAYERS (bottom first), and clients the page leaves out."""
    given = [sorted(filter(None, map(package_of, row.names))) for row in rows_of(text) if row.table == "package"]
    expected = [sorted(level) for level in LAYERS]
    found = []
    if given != expected:
        found.append(f"the package table's rows, bottom first, are {given}; tests/test_layering.py's LAYERS are {expected}")
    named = {name.rstrip("/").removesuffix(".py") for row in rows_of(text) if row.table == "client" for name in row.names}
    found += [f"the client `{client}` has no row in the clients table" for client in sorted(clients_of_the_library() - named)]
    return found


def problems(text: str) -> list[str]:
    return missing_names(text) + repeated_rows(text) + layer_order(text)


def test_architecture_md_describes_the_tree():
    with open(PAGE, encoding="utf-8") as handle:
        found = problems(handle.read())
    assert not found, "docs/architecture.md:\n" + "\n".join(found)


def test_a_wrong_page_is_reported():
    page = "\n".join([
        "See `tf_dlrm/model/` and `tf_dlrm.train.loop_config`, `tf_dlrm.config.run`.",
        "",
        "| package | what it holds |",
        "|---|---|",
        "| `tf_dlrm/io/`, `tf_dlrm/metrics.py` | `publish.py`, `nothing.py` |",
        "| `tf_dlrm/parallel/` | `DistributedEnv`, `ShardingPlan` |",
        "| `tf_dlrm/ops/` | kernels |",
        "| `tf_dlrm/io/` | again |",
        "",
        "| client | what it holds |",
        "|---|---|",
        "| `main.py` | the command |",
    ])
    found = problems(page)
    assert found[:5] == [
        "1: `tf_dlrm/model/` is not in the repository",
        "1: `tf_dlrm.config.run` does not exist",
        "5: `nothing.py` is not in tf_dlrm/io/ or tf_dlrm/",
        "6: `ShardingPlan` is defined in no module of tf_dlrm/parallel/",
        "8: `tf_dlrm/io/` has a row already (line 5)",
    ], found
    assert found[5].startswith("the package table's rows, bottom first, are [['io', 'metrics'], ['parallel'], ['ops'], "
                               "['io']]; tests/test_layering.py's LAYERS are [['calibration', 'io', 'metrics'], ['ops'], ['parallel'],")
    assert "the client `preprocessing` has no row in the clients table" in found[6:]
