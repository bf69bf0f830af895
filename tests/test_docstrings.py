"""Docstrings and ``--help`` texts say what is: the names they cite exist, and they carry no dates or history.

Read from the source of ``tf_dlrm/``, ``preprocessing/`` and the scripts at the top (nothing imported):

- every ``tf_dlrm.*`` or ``preprocessing.*`` dotted name in a docstring exists (see ``repo_names``), except
  inside a ````...```` span that holds more than a name (a command line, a manifest's value);
- every argument a Google-style ``Args:`` section documents is a parameter of its function (of ``__init__``
  for a class);
- no docstring and no flag's help (``DEFINE_*(name, default, help)``) gives a date or a change over time:
  history lives in the commit log and CHANGELOG.md.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from repo_names import REPO, dotted_name_exists

SOURCES = ("tf_dlrm", "preprocessing", "main.py", "dlrm.py", "dcnv2.py")
LITERAL = re.compile(r"``(.+?)``", re.S)
NAME = re.compile(r"(?<![\w./-])((?:tf_dlrm|preprocessing)(?:\.[A-Za-z_]\w*)+)")
HISTORY = re.compile(r"\b20\d\d-\d\d(?:-\d\d)?\b|\b(?:until|since|before|after) 20\d\d|\bno longer\b|\bformerly\b|"
                     r"\bpreviously\b|\bthe default then\b|\bused to (?:be the|count|mean|default)\b", re.I)


def python_files() -> list[str]:
    found = []
    for source in SOURCES:
        path = os.path.join(REPO, source)
        if os.path.isfile(path):
            found.append(path)
        for directory, _, files in os.walk(path):
            found += [os.path.join(directory, name) for name in sorted(files) if name.endswith(".py")]
    return found


def docstrings(tree: ast.Module):
    """``(node, docstring)`` of the module and of every class and function in it."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=True)
            if text:
                yield node, text


def cited_names(text: str) -> list[str]:
    """The dotted names ``text`` cites, leaving out the ones inside a literal that holds more than a name."""
    kept = LITERAL.sub(lambda m: m.group(0) if NAME.fullmatch(m.group(1).strip("~")) else " ", text)
    return [name.rstrip(".") for name in NAME.findall(kept)]


def documented_arguments(text: str) -> list[str]:
    """The names an ``Args:`` section documents (``a: ...``, ``a (int): ...``, ``a, b: ...``, ``*args: ...``)."""
    lines = text.split("\n")
    if "Args:" not in (line.strip() for line in lines):
        return []
    start = [line.strip() for line in lines].index("Args:") + 1
    names, indent = [], None
    for line in lines[start:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:
            break
        entry = re.match(r"\s*(\*{0,2}\w+(?:, \*{0,2}\w+)*)(?: \([^)]*\))?:", line)
        if depth == indent and entry:
            names += [name.strip().lstrip("*") for name in entry.group(1).split(",")]
    return names


def parameters(node) -> set[str] | None:
    if isinstance(node, ast.ClassDef):
        node = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    arguments = node.args
    names = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
    return names | {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}


def help_texts(tree: ast.Module):
    """``(line, text)`` of every flag's help: the third argument (or ``help=``) of a ``DEFINE_*`` call."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")).startswith("DEFINE")):
            continue
        given = node.args[2] if len(node.args) > 2 else next((k.value for k in node.keywords if k.arg == "help"), None)
        if given is not None:
            parts = given.values if isinstance(given, ast.JoinedStr) else [given]
            yield node.lineno, "".join(p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str))


def problems_of(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    where = os.path.relpath(path, REPO)
    found = []
    for node, text in docstrings(tree):
        line = getattr(node, "lineno", 1)
        found += [f"{where}:{line}: cites {name}, which does not exist" for name in cited_names(text)
                  if not dotted_name_exists(name)]
        known = parameters(node)
        if known is not None:
            found += [f"{where}:{line}: {node.name}'s Args documents '{name}', which is not a parameter "
                      f"(parameters: {sorted(known)})" for name in documented_arguments(text) if name not in known]
        found += [f"{where}:{line}: docstring gives history: {m.group(0)!r}" for m in HISTORY.finditer(text)]
    for line, text in help_texts(tree):
        found += [f"{where}:{line}: --help text gives history: {m.group(0)!r}" for m in HISTORY.finditer(text)]
    return found


@pytest.mark.parametrize("path", python_files(), ids=lambda p: os.path.relpath(p, REPO))
def test_docstrings_and_help_say_what_is(path):
    found = problems_of(path)
    assert not found, "\n".join(found)


def test_a_wrong_name_argument_or_date_is_reported(tmp_path):
    module = tmp_path / "example.py"
    module.write_text('"""Uses :class:`tf_dlrm.embedding.FeatureConfig` and :class:`tf_dlrm.cli.embedding_dims.FeatureConfig`;\n'
                      'run ``python -m preprocessing.criteo --help``; the manifest says ``format: tf_dlrm.nothing``."""\n'
                      "from absl import flags\n\n"
                      "def f(plan, seed=0):\n"
                      '    """Plans.\n\n    Args:\n        plan: a plan.\n        rank: this rank.\n'
                      '        seed, world_size: numbers.\n            rank: a continuation, not an entry.\n    """\n\n'
                      'flags.DEFINE_integer("n", 1, "Rows (until 2026-11-26 this counted elements).")\n')
    found = [line.split(": ", 1)[1] for line in problems_of(str(module))]
    assert found == [
        "cites tf_dlrm.cli.embedding_dims.FeatureConfig, which does not exist",
        "f's Args documents 'rank', which is not a parameter (parameters: ['plan', 'seed'])",
        "f's Args documents 'world_size', which is not a parameter (parameters: ['plan', 'seed'])",
        "--help text gives history: 'until 2026'",
    ], found
