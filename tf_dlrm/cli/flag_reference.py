"""The flags of ``main.py`` by topic: ``python main.py --help`` and docs/flags.md, both from the definitions.

    python -m tf_dlrm.cli.flag_reference > docs/flags.md

``tests/cli/test_flag_reference.py`` fails when docs/flags.md is not what this prints.
"""

from __future__ import annotations

import sys
import textwrap

from absl import flags

from tf_dlrm.cli.flags import TOPIC_OF, TOPICS, define_flags

HELP_ARGUMENTS = ("-h", "--help", "-?", "--helpshort")


def by_topic(flag_values: flags.FlagValues) -> dict[str, list[flags.Flag]]:
    """``{topic: [flag, ...]}`` in :data:`TOPICS` order, flags in definition order, each flag once."""
    groups: dict[str, list[flags.Flag]] = {topic: [] for topic in TOPICS}
    seen = set()
    for name, flag in flag_values._flags().items():  # definition order (absl keeps the dict in order)
        if name in TOPIC_OF and flag.name not in seen:
            seen.add(flag.name)
            groups[TOPIC_OF[flag.name]].append(flag)
    return groups


def _name(flag: flags.Flag) -> str:
    return f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"


def _default(flag: flags.Flag) -> str:
    if flag.default is None:
        return ""
    if flag.boolean and isinstance(flag.default, bool):
        return "true" if flag.default else "false"
    return str(flag.default_as_str if flag.default_as_str is not None else flag.default).strip("'")


def help_text(flag_values: flags.FlagValues, usage: str) -> str:
    """What ``python main.py --help`` prints: ``usage``, then every flag under its topic."""
    lines = [usage.strip(), "", "Flags by topic (docs/flags.md; --helpfull adds absl's own flags; "
             "--flagfile=FILE reads flags from a file, one per line):"]
    for topic, group in by_topic(flag_values).items():
        lines += ["", f"{topic}:"]
        for flag in group:
            default = _default(flag)
            text = f"{_name(flag)}: {flag.help}" + (f" (default: {default})" if default else "")
            lines += textwrap.wrap(text, width=100, initial_indent="  ", subsequent_indent="      ",
                                   break_on_hyphens=False)
    return "\n".join(lines) + "\n"


def markdown(flag_values: flags.FlagValues) -> str:
    """docs/flags.md: one table per topic."""
    lines = [
        "# Flags of main.py",
        "",
        "Generated from the flag definitions (`tf_dlrm/cli/flags.py`, the models' `Config`s through",
        "`tf_dlrm/cli/model_flags.py`) by `python -m tf_dlrm.cli.flag_reference > docs/flags.md`; a test fails when",
        "this page is stale. `python main.py --help` prints the same list. A run can be kept in a file and passed",
        "with `--flagfile` ([training.md](training.md#a-run-in-a-file)). A model given by import path",
        "(`--model=package.module:Class`) adds its own `Config`'s flags ([models.md](models.md)).",
    ]
    for topic, group in by_topic(flag_values).items():
        lines += ["", f"## {topic}", "", "| flag | default | meaning |", "| --- | --- | --- |"]
        for flag in group:
            default = _default(flag)
            meaning = flag.help.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            lines.append(f"| `{_name(flag)}` | {f'`{default}`' if default else ''} | {meaning} |")
    return "\n".join(lines) + "\n"


def fresh_flag_values() -> flags.FlagValues:
    """main.py's flags, defined in a FlagValues of their own (for the reference, not for a run)."""
    flag_values = flags.FlagValues()
    define_flags([], flag_values=flag_values)
    return flag_values


if __name__ == "__main__":
    sys.stdout.write(markdown(fresh_flag_values()))
