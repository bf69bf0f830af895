"""The Dockerfile, executed step by step where this machine can, and built for real where Docker runs.

No Docker daemon runs on the machines these tests usually run on, so the build is replayed in a
staging directory that stands for the image's file system (``WORKDIR`` -> ``<tmp>/image<WORKDIR>``):

- the build context is the repository minus ``.dockerignore``; every ``COPY`` source must exist in
  it (a missing or ignored one fails ``docker build``) and is copied the way Docker copies it;
- the ``RUN`` of ``scripts/install.sh`` (the installer ``make`` and CI run) is executed in the image
  directory as it stands at that step, with only the files copied so far: everything it runs there
  must work without the code copied later. Its ``.venv`` is a stand-in that borrows this
  repository's environment's packages (not its editable install of ``tf_dlrm``) and refuses
  ``pip``, with an up-to-date stamp, so the installer takes its "environment up to date" path (no
  network, no minutes of pip);
- the ``RUN`` that builds the C++ kernels is executed after ``COPY . .``, from the copied sources;
- the ``CMD`` (``make demo``) is checked with ``make -n`` and the image's entry point ``main.py``
  trains 2 steps with the image's ``ENV``, files and kernels.

Not covered without Docker: the base image and its apt packages (that ``RUN`` is skipped), the real pip install of
TensorFlow and Horovod (this repository's environment stands in for it), and the demo's training
itself (``make demo`` is tested by the README's commands). With a Docker daemon,
:func:`test_docker_builds_the_image` builds the image for real.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(REPO, "Dockerfile")
INSTALLER = "scripts/install.sh"


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order: comments dropped, ``\\`` continuations joined."""
    result, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        result.append((keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return result


def ignore_patterns() -> list[str]:
    with open(os.path.join(REPO, ".dockerignore"), encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip() and not line.startswith("#")]


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether ``.dockerignore`` leaves ``relative`` (or a folder above it) out of the context."""
    parts = relative.split("/")
    for end in range(1, len(parts) + 1):
        prefix = "/".join(parts[:end])
        for pattern in patterns:
            if pattern.startswith("**/"):
                if fnmatch.fnmatchcase(parts[end - 1], pattern[3:]):
                    return True
            elif fnmatch.fnmatchcase(prefix, pattern.rstrip("/")):
                return True
    return False


def context_files(source: str, patterns: list[str]) -> list[str]:
    """Files of the build context under ``source`` (relative to the repository), ignored ones left out."""
    root = os.path.normpath(os.path.join(REPO, source))
    if os.path.isfile(root):
        return [] if ignored(os.path.relpath(root, REPO).replace(os.sep, "/"), patterns) else [os.path.relpath(root, REPO)]
    found = []
    for directory, folders, files in os.walk(root):
        here = os.path.relpath(directory, REPO).replace(os.sep, "/")
        here = "" if here == "." else here + "/"
        folders[:] = [f for f in folders if not ignored(here + f, patterns)]
        found.extend(here + name for name in files if not ignored(here + name, patterns))
    return found


class ImageStage:
    """The image's file system as the Dockerfile's steps build it, under ``root``."""

    def __init__(self, root: str):
        self.root, self.workdir, self.env = root, "/", {}
        self.patterns = ignore_patterns()

    def path(self, image_path: str) -> str:
        return os.path.normpath(os.path.join(self.root, os.path.join(self.workdir, image_path).lstrip("/")))

    def copy(self, arguments: str) -> None:
        """``COPY src... dest`` as Docker does it: a folder's contents go into ``dest``."""
        *sources, destination = shlex.split(arguments)
        for source in sources:
            files = context_files(source, self.patterns)
            assert files, f"COPY {source}: not in the build context (missing, or left out by .dockerignore)"
            base = os.path.normpath(os.path.join(REPO, source))
            for relative in files:
                origin = os.path.join(REPO, relative)
                if os.path.isdir(base):
                    target = os.path.join(self.path(destination), os.path.relpath(origin, base))
                elif destination.endswith("/") or len(sources) > 1:
                    target = os.path.join(self.path(destination), os.path.basename(origin))
                else:
                    target = self.path(destination)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(origin, target)

    def set_env(self, arguments: str) -> None:
        for pair in shlex.split(arguments):
            name, _, value = pair.partition("=")
            value = value.replace("$PATH", os.environ.get("PATH", ""))
            # The image's absolute paths under WORKDIR live in the stage.
            self.env[name] = re.sub(re.escape(self.workdir.rstrip("/")) + r"(?=/|$)", self.path("."), value)

    def run(self, command: list[str], timeout: float, extra_env: dict | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env, **(extra_env or {})}
        env.pop("PYTHONPATH", None)  # the image has none: code comes from the image's own files
        return subprocess.run(command, cwd=self.path("."), env=env, capture_output=True, text=True, timeout=timeout)


def stand_in_venv(stage: ImageStage) -> None:
    """``.venv`` in the image: a fresh virtual environment of this interpreter's base Python that
    sees this repository's environment's packages (a ``.pth`` line naming its site-packages) but
    not its ``.pth`` hooks, so ``tf_dlrm`` resolves to the image's files only, never to this
    checkout's editable install. Its ``python`` refuses ``pip`` (nothing may be installed from a
    test), and the installer's stamp says the environment is up to date, with the key the
    installer computes from the files copied so far."""
    venv = stage.path(".venv")
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", venv], check=True,
                   timeout=120)
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    with open(os.path.join(venv, "lib", version, "site-packages", "host_environment.pth"), "w", encoding="utf-8") as handle:
        handle.write(site_packages + "\n")
    python = os.path.join(venv, "bin", "python")
    os.remove(python)
    with open(python, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\n"
                     'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "stand-in venv: pip refused" >&2; exit 97; fi\n'
                     'exec "$(dirname "$0")/python3" "$@"\n')
    os.chmod(python, os.stat(python).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    installer = open(stage.path(INSTALLER), encoding="utf-8").read()
    tf_version = re.search(r'^tf_version="([^"]+)"', installer, re.M).group(1)
    horovod_version = re.search(r'^horovod_version="([^"]+)"', installer, re.M).group(1)
    patch = f"scripts/patches/horovod-{horovod_version}-without-xla-ops.patch"
    digest = subprocess.run(f"cat scripts/install.sh {patch} setup.cfg pyproject.toml 2>/dev/null | sha256sum | cut -c1-16",
                            shell=True, cwd=stage.path("."), capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(venv, ".tf_dlrm_install_stamp"), "w", encoding="utf-8") as handle:
        handle.write(f"{digest}|tensorflow-cpu=={tf_version} test\n")


@pytest.fixture(scope="module")
def steps():
    with open(DOCKERFILE, encoding="utf-8") as handle:
        return instructions(handle.read())


def test_dockerfile_lints_clean():
    hadolint = os.path.join(os.path.dirname(sys.executable), "hadolint")
    result = subprocess.run([hadolint, DOCKERFILE], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_install_step_is_the_installer_that_make_and_ci_run(steps):
    runs = [arguments for keyword, arguments in steps if keyword == "RUN"]
    assert any(f"bash {INSTALLER}" in command for command in runs), runs
    makefile = open(os.path.join(REPO, "Makefile"), encoding="utf-8").read()
    install_recipe = re.search(r"^install:\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert f"bash {INSTALLER}" in install_recipe
    assert re.search(r"^test: install", makefile, re.M)  # make test installs first
    assert "make test" in open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()


def test_dockerignore_keeps_the_hosts_builds_out():
    patterns = ignore_patterns()
    assert ignored(".venv/bin/python", patterns) and ignored("tf_dlrm/ops/_tf_dlrm_ops.so", patterns)
    assert ignored("tests/__pycache__/x.pyc", patterns) and not ignored("tf_dlrm/ops/build.py", patterns)


@pytest.mark.slow
def test_replaying_the_dockerfile_builds_a_working_image(steps, tmp_path):
    stage = ImageStage(str(tmp_path / "image"))
    commands = []
    for keyword, arguments in steps:
        if keyword == "WORKDIR":
            stage.workdir = arguments
            os.makedirs(stage.path("."), exist_ok=True)
        elif keyword == "COPY":
            stage.copy(arguments)
        elif keyword == "ENV":
            stage.set_env(arguments)
        elif keyword == "RUN" and INSTALLER in arguments:
            stand_in_venv(stage)
            # As written in the Dockerfile (PYTHON=... bash scripts/install.sh), in the image as it is now.
            result = stage.run(["bash", "-c", arguments], timeout=300, extra_env={"TF_DLRM_FORCE_CPU": "1"})
            assert result.returncode == 0, f"RUN {arguments} failed in the image:\n{result.stderr[-3000:]}"
            assert "is up to date" in result.stderr, result.stderr[-3000:]  # the stand-in path, not pip
            commands.append(arguments)
        elif keyword == "RUN" and "apt-get" in arguments:
            continue  # the base image's packages: not replayable here (see the module docstring)
        elif keyword == "RUN":
            result = stage.run(["bash", "-c", arguments], timeout=600)
            assert result.returncode == 0, f"RUN {arguments} failed in the image:\n{result.stderr[-3000:]}"
            commands.append(arguments)
        elif keyword == "CMD":
            command = json.loads(arguments)
            assert command[:1] == ["make"], command
            result = stage.run(command[:1] + ["-n"] + command[1:], timeout=60)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "main.py" in result.stdout  # the demo trains through main.py
    assert len(commands) == 2, commands
    # The kernels were built from the copied sources (the host's library is left out by .dockerignore).
    assert os.path.exists(stage.path("tf_dlrm/ops/_tf_dlrm_ops.so"))
    assert stage.env["PATH"].startswith(stage.path(".venv/bin"))
    # The image's entry point trains (2 steps on in-memory synthetic batches), with the image's
    # files, ENV and kernels: `python` is the image's .venv/bin/python through PATH.
    log = tmp_path / "log.jsonl"
    result = stage.run(["python", "main.py", "--dataset_type=synthetic", "--feature_spec=feature_specs/synthetic_small.yaml",
                        "--batch_size=64", "--max_steps=2", "--valid_split=", "--embedding_dim=8", "--bottom_mlp_dims=16,8",
                        "--top_mlp_dims=16,1", "--print_freq=1", f"--log_path={log}"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    final = json.loads(log.read_text().splitlines()[-1])
    assert final["event"] == "final" and final["steps"] == 2, final
    # The dataset tools run there too.
    result = stage.run(["python", "-m", "preprocessing.criteo", "--help"], timeout=120)
    assert result.returncode == 0 and "--output_dir" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]


def test_docker_builds_the_image(tmp_path):
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip("no Docker daemon here: the build is replayed by test_replaying_the_dockerfile_builds_a_working_image")
    result = subprocess.run([docker, "build", "-t", "tf_dlrm:test", REPO], capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
