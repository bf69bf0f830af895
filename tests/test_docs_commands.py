"""The shell blocks of README.md and docs/*.md marked ``<!-- test: run -->`` run, and print what the page shows.

A page marks a fenced ``bash`` block to run with the line ``<!-- test: run -->`` just before it; the
block may be followed by ``<!-- test: output -->`` and a fenced block of the lines its output must
contain, in order (``...`` in a line matches anything; a line that is only ``...`` is a reminder that
lines were left out). A block of any language after ``<!-- test: file NAME -->`` is written to ``NAME``, for
the blocks after it to run (a page's Python example, then the commands that run it). A page's blocks run in
order, in one sandbox: a directory with a link to every
top-level entry of the repository but ``data/``, so that ``.venv/bin/python``, ``main.py`` and
``feature_specs/`` mean what they mean in a checkout, and what a block writes under ``data/`` stays in
the sandbox. ``python`` and ``horovodrun`` are the virtual environment's. The commands on the pages are
chosen tiny (seconds each), so a renamed flag, module or file breaks this test, not a user.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from typing import NamedTuple

import pytest

from conftest import REPO

RUN = "<!-- test: run -->"
OUTPUT = "<!-- test: output -->"
FILE = re.compile(r"<!-- test: file ([\w.-]+) -->")
RANK_PREFIX = re.compile(r"^\[\d+\]<std(out|err)>:")  # horovodrun's prefix of each rank's lines
NOT_LINKED = {"data", "runs", "build", ".git", ".pytest_cache"}


class Block(NamedTuple):
    page: str
    line: int  # 1-based line of the block's opening fence
    command: str
    expected: tuple[str, ...]
    file: str | None = None  # the block is this file's text, written, not run


def _fenced(lines: list[str], start: int, page: str) -> tuple[list[str], int]:
    """The lines of the fenced block opening at ``lines[start]`` and the index after its closing fence."""
    if not lines[start].lstrip().startswith("```"):
        raise ValueError(f"{page}:{start + 1}: a fenced block must follow the test marker. Received: {lines[start]!r}")
    end = start + 1
    while end < len(lines) and not lines[end].lstrip().startswith("```"):
        end += 1
    if end == len(lines):
        raise ValueError(f"{page}:{start + 1}: the fenced block is not closed")
    return lines[start + 1:end], end + 1


def blocks_of(page: str) -> list[Block]:
    with open(os.path.join(REPO, page), encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    found, index = [], 0
    while index < len(lines):
        file = FILE.fullmatch(lines[index].strip())
        if file:
            text, index = _fenced(lines, index + 1, page)
            found.append(Block(page, index - len(text) - 1, "\n".join(text) + "\n", (), file.group(1)))
            continue
        if lines[index].strip() != RUN:
            index += 1
            continue
        start = index + 1
        command, index = _fenced(lines, start, page)
        expected: list[str] = []
        after = index
        while after < len(lines) and not lines[after].strip():
            after += 1
        if after < len(lines) and lines[after].strip() == OUTPUT:
            expected, index = _fenced(lines, after + 1, page)
        found.append(Block(page, start + 1, "\n".join(command), tuple(line.strip() for line in expected if line.strip())))
    return found


PAGES = [page for page in ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
         if blocks_of(page)]


def missing_lines(expected: tuple[str, ...], output: str) -> str | None:
    """The first expected line not found (in order) in ``output``, or None."""
    lines = [RANK_PREFIX.sub("", line).strip() for line in output.splitlines()]
    position = 0
    for want in expected:
        if want == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")))
        while position < len(lines) and not pattern.fullmatch(lines[position]):
            position += 1
        if position == len(lines):
            return want
        position += 1
    return None


def sandbox(directory) -> str:
    for name in os.listdir(REPO):
        if name not in NOT_LINKED:
            os.symlink(os.path.join(REPO, name), os.path.join(directory, name))
    os.mkdir(os.path.join(directory, "data"))
    return str(directory)


def run_block(block: Block, directory: str) -> None:
    if block.file:
        with open(os.path.join(directory, block.file), "w", encoding="utf-8") as handle:
            handle.write(block.command)
        return
    environment = dict(os.environ)
    environment.update({
        "PATH": os.path.join(REPO, ".venv", "bin") + os.pathsep + environment.get("PATH", ""),
        "PYTHONPATH": REPO + os.pathsep + environment.get("PYTHONPATH", ""),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    })
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.command], cwd=directory, env=environment,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    where = f"{block.page}:{block.line}"
    if done.returncode != 0:
        pytest.fail(f"{where}: the block exited with {done.returncode}:\n{block.command}\n--- output (tail) ---\n"
                    f"{done.stdout[-4000:]}", pytrace=False)
    missing = missing_lines(block.expected, done.stdout)
    if missing is not None:
        pytest.fail(f"{where}: the output differs from the page: no line matching {missing!r} (in order)\n"
                    f"{block.command}\n--- output (tail) ---\n{done.stdout[-4000:]}", pytrace=False)


@pytest.mark.parametrize("page", PAGES)
def test_documented_commands_run(page, tmp_path):
    directory = sandbox(tmp_path)
    for block in blocks_of(page):
        run_block(block, directory)


def test_the_marker_parser_and_the_output_match(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"text\n{RUN}\n```bash\necho a\necho b\n```\n\n{OUTPUT}\n```text\na...\n...\nb\n```\n"
                    f"```bash\nnot run\n```\n{RUN}\n```bash\ntrue\n```\n"
                    f"<!-- test: file x.py -->\n```python\nprint(2)\n```\n{RUN}\n```bash\npython3 x.py\n```\n")
    blocks = blocks_of(os.path.relpath(page, REPO))
    assert [(b.line, b.command, b.expected, b.file) for b in blocks] == [
        (3, "echo a\necho b", ("a...", "...", "b"), None), (18, "true", (), None), (22, "print(2)\n", (), "x.py"),
        (26, "python3 x.py", (), None)]
    for block in blocks[2:]:
        run_block(block, str(tmp_path))
    assert (tmp_path / "x.py").read_text() == "print(2)\n"
    assert missing_lines(("a...", "b"), "xa1\nabc\nb\n") is None
    assert missing_lines(("b", "a..."), "abc\nb\n") == "a..."  # in order
    assert missing_lines(("validation AUC 0.8...",), "validation AUC 0.79") == "validation AUC 0.8..."
    assert missing_lines(("world size 2",), "[1]<stderr>:world size 2") is None
