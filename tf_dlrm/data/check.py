"""``python -m tf_dlrm.data.check --dataset_path=DIR``: scan a split_binary dataset once, report every problem.

Problems found (all of them, one line each, not only the first):

- a data file missing, or whose size is not a whole number of records;
- files of one split holding different sample counts;
- a label other than 0/1;
- a categorical id outside ``[0, cardinality)`` (per feature: how many, and the first sample);
- a variable-length feature's row longer than its hotness, or an ids file that does not hold the sum
  of its lengths (:mod:`tf_dlrm.data.ragged_split_binary`);
- a NaN or inf numerical value (per feature: how many, and the first sample).

Every file is read once, in blocks of ``--block_samples`` samples (memory stays bounded). Exit
status 0 when the dataset is clean, 1 when a problem was found, 2 when the spec itself is unusable.
Numpy only: no TensorFlow is imported.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import app, flags

from tf_dlrm.data.ragged_split_binary import RaggedColumn
from tf_dlrm.data.validation import BadDataError, id_problem, raw_label_dtype
from tf_dlrm.spec.format import SPLIT_BINARY, FeatureSpecError
from tf_dlrm.spec.feature_spec import FeatureSpec


def _file_problems(spec: FeatureSpec, split: str) -> tuple[list[str], int | None]:
    """Missing and wrongly sized files of a split, and its sample count when the sizes agree."""
    return spec.split_binary_problems(split, prefix=lambda index: f"split '{split}'")


def _blocks(path: str, dtype: np.dtype, width: int, count: int, block: int):
    """``(first sample, [n, width] values)`` over a whole file, ``block`` samples at a time."""
    values = np.memmap(path, dtype=dtype, mode="r", shape=(count, width)) if count else np.zeros((0, width), dtype)
    for start in range(0, count, block):
        yield start, np.asarray(values[start:start + block])


def _count_and_first(mask: np.ndarray, start: int, found: dict, key) -> None:
    if mask.any():
        total, first = found.get(key, (0, None))
        found[key] = (total + int(mask.sum()), first if first is not None else start + int(np.flatnonzero(mask)[0]))


def _variable_length_problems(spec: FeatureSpec, split: str, index: int, count: int, block: int, found: dict) -> list[str]:
    """A variable-length feature (lengths file beside its ids): its lengths and file sizes (a line, then
    nothing more: ids would not line up with samples), else its ids, counted in ``found`` as a fixed file's."""
    name, files = spec.categorical_features[index], spec.split_files(split)
    path, cardinality = files.categorical[index], spec.cardinalities()[index]
    try:
        column = RaggedColumn(path, files.lengths_of(index), spec.dtype(name), spec.hotness(name), name, split, count, block)
    except BadDataError as error:
        return [str(error)]
    for start in range(0, count, block):
        ids, lengths = column.read(start, block)
        outside = (ids < 0) | (ids >= cardinality)
        if outside.any():
            total, first = found.get(("categorical", name, path), (0, None))
            sample = start + int(np.searchsorted(np.cumsum(lengths, dtype=np.int64), np.flatnonzero(outside)[0], side="right"))
            found[("categorical", name, path)] = (total + int(outside.sum()), first if first is not None else sample)
    return []


def scan_split(spec: FeatureSpec, split: str, block: int = 1 << 20) -> list[str]:
    """Every problem of one split, as readable lines (empty: the split is clean)."""
    problems, count = _file_problems(spec, split)
    if count is None:
        return problems  # sizes disagree: values at a sample index would not line up
    files = spec.split_files(split)
    found: dict = {}
    first_label = None  # the value of the first bad label, named in its line
    # A bool file is read as bytes: numpy would read a byte 2 or 255 of a bool array as True.
    for start, labels in _blocks(files.label, raw_label_dtype(spec.dtype(spec.label_feature)), 1, count, block):
        bad = ((labels != 0) & (labels != 1)).reshape(-1)
        if first_label is None and bad.any():
            first_label = labels.reshape(-1)[np.flatnonzero(bad)[0]].item()
        _count_and_first(bad, start, found, ("label", spec.label_feature, files.label))
    if files.numerical:
        names = spec.numerical_features
        for start, values in _blocks(files.numerical, spec.numerical_dtype(), len(names), count, block):
            bad = ~np.isfinite(values)
            for column in np.flatnonzero(bad.any(axis=0)):
                _count_and_first(bad[:, column], start, found, ("numerical", names[column], files.numerical))
    for index, (name, path, cardinality) in enumerate(zip(spec.categorical_features, files.categorical, spec.cardinalities())):
        if files.lengths_of(index):
            problems += _variable_length_problems(spec, split, index, count, block, found)
            continue
        # A multi-hot feature's file holds ``hotness`` ids per sample: counted per id, located by sample.
        for start, ids in _blocks(path, spec.dtype(name), spec.hotness(name), count, block):
            if id_problem(ids, cardinality, start) is not None:
                outside = (ids < 0) | (ids >= cardinality)
                total, first = found.get(("categorical", name, path), (0, None))
                first_bad = start + int(np.flatnonzero(outside.any(axis=1))[0])
                found[("categorical", name, path)] = (total + int(outside.sum()), first if first is not None else first_bad)
    what = {"label": "label(s) not 0 or 1", "numerical": "NaN or inf value(s)"}
    for (kind, name, path), (total, first) in found.items():
        if kind == "categorical":
            cardinality = spec.cardinalities()[spec.categorical_features.index(name)]
            description = f"id(s) outside [0, {cardinality})"
        else:
            description = what[kind]
        value = f" holding {first_label}" if kind == "label" else ""
        problems.append(
            f"split '{split}', feature '{name}', file {path}: {total} {description}, the first at sample {first}{value}"
        )
    if count == 0:
        problems.append(f"split '{split}': no samples (its files are empty)")
    return problems


def scan(spec: FeatureSpec, block: int = 1 << 20) -> dict[str, list[str]]:
    """Problems per split_binary split of ``spec`` (other chunk types are only checked to exist)."""
    report = {}
    for split in spec.splits:
        if spec.chunk_type(split) == SPLIT_BINARY:
            report[split] = scan_split(spec, split, block)
    return report


def _define_flags() -> None:
    """The command's flags, defined when it runs (not on import: the scan functions are a library too, and
    main.py's own flags share the names)."""
    flags.DEFINE_string("dataset_path", None, "Directory of the dataset.")
    flags.DEFINE_string("feature_spec", "feature_spec.yaml", "Feature spec file, relative to --dataset_path unless absolute.")
    flags.DEFINE_integer("block_samples", 1 << 20, "Samples read at a time per file.")


def main(argv) -> None:
    del argv
    values = flags.FLAGS
    if not values.dataset_path:
        print("error: --dataset_path is required", file=sys.stderr)
        sys.exit(2)
    if values.block_samples <= 0:
        print(f"error: Expected --block_samples > 0. Received: --block_samples={values.block_samples}", file=sys.stderr)
        sys.exit(2)
    path = os.path.join(values.dataset_path, values.feature_spec)
    try:
        spec = FeatureSpec.load(path, check_files=False)
        report = scan(spec, values.block_samples)
    except (FeatureSpecError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    problems = [line for lines in report.values() for line in lines]
    for line in problems:
        print(line)
    splits = ", ".join(f"{split}: {'ok' if not lines else f'{len(lines)} problem(s)'}" for split, lines in report.items())
    print(f"checked {path}: {splits}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
