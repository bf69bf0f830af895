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


def test_the_flags_explained_in_docs_training_exist():
    """docs/training.md explains the flags that matter in a table kept by hand: every flag it names must
    still be a flag of main.py (a renamed or removed flag fails here, not in a user's command line)."""
    import re

    with open(os.path.join(REPO, "docs", "training.md"), encoding="utf-8") as handle:
        page = handle.read()
    table = page[page.index("### Flags of `main.py`"):]
    table = table[:table.index("\n### ", 1)]
    named = {name for row in table.splitlines() if row.startswith("| `--")
             for name in re.findall(r"`--(?:\[no\])?([a-z0-9_]+)", row.split(" | ")[0])}
    values = flag_reference.fresh_flag_values()
    assert len(named) > 50
    assert sorted(name for name in named if name not in values) == []
