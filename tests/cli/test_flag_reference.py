"""docs/flags.md is what the flag definitions generate, and `python main.py --help` lists every flag by topic."""

from __future__ import annotations

import os

from conftest import REPO, run_python
from tf_dlrm.cli import flag_reference
from tf_dlrm.cli.flags import TOPIC_OF, TOPICS

DOC = os.path.join(REPO, "docs", "flags.md")


def test_docs_flags_md_is_current():
    expected = flag_reference.markdown(flag_reference.fresh_flag_values())
    with open(DOC, encoding="utf-8") as handle:
        written = handle.read()
    assert written == expected, "docs/flags.md is stale: run python -m tf_dlrm.cli.flag_reference > docs/flags.md"


def test_every_flag_has_one_topic_and_every_topic_flags():
    values = flag_reference.fresh_flag_values()
    groups = flag_reference.by_topic(values)
    names = [flag.name for group in groups.values() for flag in group]
    assert sorted(names) == sorted({values[name].name for name in values if name in TOPIC_OF})
    assert len(names) == len(set(names)) and "dataset_path" in names and "amp" in names and "interaction" in names
    assert set(TOPIC_OF.values()) == set(TOPICS) and all(groups.values())


def test_main_help_lists_the_flags_by_topic():
    completed = run_python(["main.py", "--help"])
    text = completed.stdout
    positions = [text.index(f"\n{topic}:\n") for topic in TOPICS]
    assert positions == sorted(positions), "topics out of order"
    for name in ("--dataset_path", "--[no]xla", "--embedding_optimizer", "--num_cross_layers", "--[no]resume"):
        assert f"\n  {name}: " in text, name
    assert "Try --helpfull" not in text


# Pages that explain main.py's flags in prose; a flag they name in `code` must still exist.
PROSE_PAGES = ("training.md", "performance.md", "serving.md")
# Named there but not main.py's own: absl's --flagfile, and the data tools' --output_dir.
NOT_MAIN_FLAGS = {"flagfile", "output_dir"}


def flags_named_in_prose(page: str) -> set[str]:
    """The main.py flags a page names in inline code outside fenced blocks: every ``--name`` of a code span
    that starts with ``--`` (spans of other commands, and names followed by ``-`` as horovodrun's, are not)."""
    import re

    text = re.sub(r"^```.*?^```", "", page, flags=re.S | re.M)
    return {name for span in re.findall(r"`(--[^`]+)`", text)
            for name in re.findall(r"(?:^|\s)--(?:\[no\])?([a-z0-9_]+)(?=[= ]|$)", span)}


def test_the_flags_explained_in_the_docs_exist():
    """docs/training.md explains the flags that matter by task, docs/performance.md and docs/serving.md name the
    switches they measure: every flag they name must still be a flag of main.py (a renamed or removed flag fails
    here, not in a user's command line)."""
    values = flag_reference.fresh_flag_values()
    unknown = {}
    for name in PROSE_PAGES:
        with open(os.path.join(REPO, "docs", name), encoding="utf-8") as handle:
            named = flags_named_in_prose(handle.read())
        missing = sorted(flag for flag in named - NOT_MAIN_FLAGS if flag not in values
                         and not (flag.startswith("no") and flag[2:] in values and values[flag[2:]].boolean))
        if missing:
            unknown[name] = missing
        if name == "training.md":
            assert len(named) > 40, sorted(named)
    assert unknown == {}


def test_prose_flags_are_read_from_inline_code_outside_blocks():
    named = flags_named_in_prose("`--amp=auto`, `--noresume` and `--embedding_dim`; `python x.py --not_this`, "
                                 "`--network-interface eth0`\n```\n`--in_a_block`\n```\n")
    assert named == {"amp", "noresume", "embedding_dim"}
