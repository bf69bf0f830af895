"""The repository's top level is the one the project's design names, and a checkout runs its tools as it is.

``preprocessing/`` (the dataset-preparation tools users run) sits beside ``tf_dlrm/``, once: nothing of it
under ``tf_dlrm/``. A pip install carries it (setup.cfg's packages) and its console script resolves; a
fresh checkout runs ``python -m preprocessing.criteo`` from its root with nothing installed from it.
"""

from __future__ import annotations

import configparser
import importlib
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

TOP_LEVEL = ("tf_dlrm/", "feature_specs/", "preprocessing/", "tests/", "setup.cfg", "Dockerfile", "main.py")


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(os.path.join(REPO, "setup.cfg"))
    return parser


def console_scripts() -> dict[str, str]:
    lines = setup_cfg()["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict((part.strip() for part in line.split("=", 1)) for line in lines)


def test_the_top_level_holds_what_the_design_names():
    missing = [name for name in TOP_LEVEL
               if not (os.path.isdir if name.endswith("/") else os.path.isfile)(os.path.join(REPO, name.rstrip("/")))]
    assert not missing, f"Expected at the repository's top level: {list(TOP_LEVEL)}. Missing: {missing}"
    assert os.path.isfile(os.path.join(REPO, "preprocessing", "__init__.py"))
    assert os.path.isfile(os.path.join(REPO, "preprocessing", "prepare_dataset.sh"))


def test_preprocessing_has_one_copy():
    """No package of that name under tf_dlrm/, and no tf_dlrm module named like one of preprocessing's."""
    ours = {name for name in os.listdir(os.path.join(REPO, "preprocessing"))
            if name.endswith(".py") and name != "__init__.py"}
    twins = []
    for directory, subdirectories, files in os.walk(os.path.join(REPO, "tf_dlrm")):
        twins += [os.path.join(directory, name) for name in subdirectories if name == "preprocessing"]
        twins += [os.path.join(directory, name) for name in files if name in ours]
    assert not twins, f"Expected preprocessing's code only under preprocessing/. Received copies: {twins}"


def test_a_pip_install_carries_preprocessing_and_its_console_script():
    include = setup_cfg()["options.packages.find"]["include"].split()
    assert {"tf_dlrm", "tf_dlrm.*", "preprocessing", "preprocessing.*"} <= set(include), include
    scripts = console_scripts()
    assert scripts["tf-dlrm-preprocess-criteo"] == "preprocessing.console_script:criteo"
    for name, target in scripts.items():
        module, attribute = target.split(":")
        assert module.split(".")[0] in {entry.split(".")[0] for entry in include} | {"main"}, (name, target)
        assert callable(getattr(importlib.import_module(module), attribute)), (name, target)


def clone_like_checkout(directory: str) -> str:
    """The files a clone of this checkout would hold (tracked, or new and not ignored), copied to ``directory``."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                                capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"needs a git checkout to list its files: {error}")
    for name in listed.decode().split("\0"):
        source = os.path.join(REPO, name)
        if name and os.path.isfile(source):  # a file deleted but not yet committed is listed too
            os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
            shutil.copy2(source, os.path.join(directory, name))
    return directory


def test_python_m_preprocessing_criteo_runs_from_a_fresh_checkout(tmp_path):
    checkout = clone_like_checkout(str(tmp_path / "checkout"))
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["TF_CPP_MIN_LOG_LEVEL"] = "2"
    done = subprocess.run([sys.executable, "-m", "preprocessing.criteo", "--help"], cwd=checkout, env=environment,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.startswith("Criteo click logs -> split_binary dataset"), done.stdout[:500]
    assert "--input" in done.stdout and "--output_dir" in done.stdout
    # Both packages come from the checkout itself, not from an installed copy elsewhere.
    where = subprocess.run([sys.executable, "-c", "import preprocessing.criteo, tf_dlrm; "
                            "print(preprocessing.criteo.__file__); print(tf_dlrm.__file__)"],
                           cwd=checkout, env=environment, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    real = os.path.realpath(checkout)
    assert all(os.path.realpath(path).startswith(real + os.sep) for path in where.stdout.split()), where.stdout
