"""Whether a name that docs or docstrings cite exists in the repository, read from the source (nothing imported).

A dotted name (``tf_dlrm.embedding.Model``, ``tf_dlrm.train.step.Trainer.train_step``) exists when its longest
prefix that is a module or package on disk defines the rest: a top-level class, function, assignment or
imported name, then an attribute of that class. A path (``tf_dlrm/embedding/``, ``preprocessing/criteo.py``)
exists when it is on disk.
"""

from __future__ import annotations

import ast
import functools
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def parsed(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as handle:
        return ast.parse(handle.read(), path)


def bound_names(body) -> dict[str, ast.AST | None]:
    """Names bound at the level of ``body`` (branches of ``if`` and ``try`` included), with their class node."""
    names: dict[str, ast.AST | None] = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update({n.id: None for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(alias.asname or alias.name).split(".")[0]: None for alias in node.names})
        elif isinstance(node, (ast.If, ast.Try)):
            for branch in [node.body, node.orelse, *(h.body for h in getattr(node, "handlers", []))]:
                names.update(bound_names(branch))
    return names


def module_file(parts: list[str], root: str = REPO) -> str | None:
    base = os.path.join(root, *parts)
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def dotted_name_exists(name: str, root: str = REPO) -> bool:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        path = module_file(parts[:end], root)
        if path is None:
            continue
        rest, scope = parts[end:], bound_names(parsed(path).body)
        for attribute in rest:
            if attribute not in scope:
                return False
            node = scope[attribute]
            if node is None:  # a function, a value or an imported name: what it holds is not read here
                return True
            scope = bound_names(node.body)
        return True
    return False


def path_exists(path: str, root: str = REPO) -> bool:
    return os.path.isdir(os.path.join(root, path)) if path.endswith("/") else os.path.isfile(os.path.join(root, path))
