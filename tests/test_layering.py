"""tf_dlrm's packages are layered: a package imports only packages below it (and itself).

Every ``import`` of a tf_dlrm module is checked, at module level or inside a function (a lazy import
hides an upward dependency, it does not remove it), ``import x`` and ``from x import y`` alike. A
package or top-level module missing from :data:`LAYERS` fails too, so a new one must be placed.
Above all of tf_dlrm sit the repository's own clients of it (``preprocessing/``, ``main.py``, the
example scripts): tf_dlrm never imports them.
"""

from __future__ import annotations

import ast
import os
from typing import NamedTuple

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "tf_dlrm")

# Bottom to top. A package may import the packages of the levels below its own, never above; packages
# on one level are independent of each other.
LAYERS = (
    ("io", "metrics", "calibration"),  # publishing outputs safely; exact AUC and logloss; post-hoc calibration (numpy only: the synthetic data's
                        # oracle and the training loop both score with them)
    ("ops",),           # the C++ kernels and their Python wrappers
    ("parallel",),      # Horovod's environment and collectives
    ("sharding",),      # the pure-Python plan: where tables live, memory, traffic
    ("spec",),          # the FeatureSpec, its format and checks
    ("data",),          # readers, writers, synthetic data, transcoding
    ("optimizers",),    # sparse and dense optimizers, their settings
    ("embedding",),     # the distributed embedding layer and everything it executes
    ("models",),        # the models and their shared layers
    ("train",),         # the step, the loop, metrics, guards
    ("checkpoint",),    # checkpoints and export
    ("cli",),           # main.py's flags, modes and process set-up
)
LEVEL = {package: level for level, packages in enumerate(LAYERS) for package in packages}


class Edge(NamedTuple):
    path: str
    line: int
    source: str
    target: str


def package_of(module: str) -> str:
    """``tf_dlrm.embedding.pooling`` -> ``embedding``; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_of(path: str, root: str) -> str:
    relative = os.path.relpath(path, os.path.dirname(root))[: -len(".py")].replace(os.sep, ".")
    return relative[: -len(".__init__")] if relative.endswith(".__init__") else relative


def imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        if node.module == "tf_dlrm":
            # `from tf_dlrm import train`: the package named after `import`.
            return [f"tf_dlrm.{alias.name}" for alias in node.names]
        return [node.module]
    return []


def import_sites(root: str):
    """``(path, line, imported module)`` of every absolute import in the ``.py`` files under ``root``."""
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8") as handle:
                tree = ast.parse(handle.read(), path)
            for node in ast.walk(tree):
                for module in imported_modules(node):
                    yield path, node.lineno, module


def package_edges(root: str = PACKAGE) -> tuple[list[Edge], set[str]]:
    """Every import between two different tf_dlrm packages, and every package (or top-level module) seen."""
    edges, packages = [], set()
    for directory, _, files in os.walk(root):
        packages.update(package_of(module_of(os.path.join(directory, name), root)) for name in files if name.endswith(".py"))
    for path, line, module in import_sites(root):
        source = package_of(module_of(path, root))
        if not module.startswith("tf_dlrm."):
            continue
        target = package_of(module)
        if source and target != source:
            edges.append(Edge(os.path.relpath(path, os.path.dirname(root)), line, source, target))
    packages.discard("")
    return edges, packages


def clients_of_the_library(repo: str = REPO) -> set[str]:
    """The importable names at the top of the repository other than tf_dlrm: its packages and modules."""
    names = set()
    for name in os.listdir(repo):
        path = os.path.join(repo, name)
        if name.endswith(".py") and os.path.isfile(path):
            names.add(name[: -len(".py")])
        elif os.path.isfile(os.path.join(path, "__init__.py")) and name != "tf_dlrm":
            names.add(name)
    return names


def imports_of_clients(root: str, clients: set[str]) -> list[str]:
    """``path:line: ...`` for every import, under ``root``, of a module of ``clients``."""
    return [f"{os.path.relpath(path, os.path.dirname(root))}:{line}: imports '{module}', which is above tf_dlrm "
            f"(a client of the library); expected tf_dlrm to import only tf_dlrm and third-party modules"
            for path, line, module in import_sites(root) if module.split(".")[0] in clients]


def violations(edges: list[Edge], level: dict[str, int]) -> list[str]:
    found = []
    for edge in edges:
        if edge.target not in level or edge.source not in level:
            continue  # reported by the unplaced-packages check
        if level[edge.target] >= level[edge.source]:
            found.append(f"{edge.path}:{edge.line}: package '{edge.source}' (level {level[edge.source]}) imports "
                         f"'{edge.target}' (level {level[edge.target]}); expected only packages below "
                         f"'{edge.source}'")
    return found


def test_every_package_has_a_level():
    edges, packages = package_edges()
    unplaced = sorted((packages | {edge.target for edge in edges}) - set(LEVEL))
    assert not unplaced, (f"Expected every package and top-level module of tf_dlrm/ in LAYERS "
                          f"(tests/test_layering.py). Received unplaced: {unplaced}")


def test_no_import_runs_up_the_layers():
    edges, _ = package_edges()
    found = violations(edges, LEVEL)
    assert not found, "upward imports:\n" + "\n".join(found)


def test_tf_dlrm_never_imports_its_clients():
    clients = clients_of_the_library()
    assert {"preprocessing", "main"} <= clients, clients
    found = imports_of_clients(PACKAGE, clients)
    assert not found, "imports of code above tf_dlrm:\n" + "\n".join(found)


def test_an_import_of_a_client_is_reported(tmp_path):
    root = tmp_path / "tf_dlrm"
    (root / "data").mkdir(parents=True)
    (root / "data" / "fractions.py").write_text("import os\n\ndef f():\n    from preprocessing.splits import make_plan\n")
    found = imports_of_clients(str(root), {"preprocessing", "main"})
    assert found == ["tf_dlrm/data/fractions.py:4: imports 'preprocessing.splits', which is above tf_dlrm (a client of "
                     "the library); expected tf_dlrm to import only tf_dlrm and third-party modules"]


def test_the_walk_sees_real_edges():
    edges, packages = package_edges()
    pairs = {(edge.source, edge.target) for edge in edges}
    # A module-level import and a function-level one (cli.main imports its modes inside run()).
    assert ("data", "spec") in pairs and ("cli", "data") in pairs
    assert {"embedding", "sharding", "cli"} <= packages


@pytest.mark.parametrize("code, target", [
    ("import tf_dlrm.cli.flags\n", "cli"),
    ("from tf_dlrm.train.loop import Loop\n", "train"),
    ("from tf_dlrm import models\n", "models"),
    ("def f():\n    from tf_dlrm.checkpoint import store\n", "checkpoint"),
])
def test_an_upward_import_is_reported_with_file_line_and_packages(tmp_path, code, target):
    root = tmp_path / "tf_dlrm"
    (root / "sharding").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sharding" / "__init__.py").write_text("")
    (root / "sharding" / "plan.py").write_text("import os\n" + code)
    edges, _ = package_edges(str(root))
    found = violations(edges, LEVEL)
    assert len(found) == 1
    line = 1 + code.count("\n")  # the import is the snippet's last line, after `import os`
    assert found[0].startswith(f"tf_dlrm/sharding/plan.py:{line}: package 'sharding'")
    assert f"imports '{target}'" in found[0]


def test_a_downward_import_is_allowed(tmp_path):
    root = tmp_path / "tf_dlrm"
    (root / "cli").mkdir(parents=True)
    (root / "cli" / "flags.py").write_text("from tf_dlrm.sharding.plan import Strategy\nimport tf_dlrm.io.publish\n")
    edges, _ = package_edges(str(root))
    assert len(edges) == 2 and violations(edges, LEVEL) == []
