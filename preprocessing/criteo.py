r"""Criteo click logs -> split_binary dataset + ``feature_spec.yaml`` (what ``main.py`` reads).

    python -m preprocessing.criteo --input=day_0.gz,...,day_23.gz --output_dir=DIR \
        --frequency_threshold=3 --split=days [--engine=local|spark] [--spark_master=URL]
    python -m preprocessing.criteo --input=train.txt --output_dir=DIR --split=fraction --test_fraction=0.1
        # three splits: train, validation (select on it; --valid_fraction, by default as --test_fraction), test (report it)
    python -m preprocessing.criteo --input=train.txt --output_dir=DIR --split=fraction --test_fraction=0.1 \
        --valid_fraction=0    # two splits, the Kaggle convention: train, test
    preprocessing/prepare_dataset.sh RAW_DIR OUTPUT_DIR [--flag=value ...]
        # a directory of day_0 .. day_23 (or train.txt) with this project's usual settings

Inputs: TSV without header (1TB days, Kaggle ``train.txt``) or CSV with the Criteo header, plain
or ``.gz``. The transform (label as bool; integers ``log(1 + max(x, 0))`` as float16, missing 0;
categorical hashes -> ids: 0 missing, 1 rare/unseen, 2.. by descending training count) is
described in :mod:`preprocessing.criteo_format` and :mod:`preprocessing.vocabulary`; the splits in
:mod:`preprocessing.splits`.

``OUTPUT_DIR`` gets ``feature_spec.yaml``, ``<split>/label.bin, numerical.bin, cat_<i>.bin``,
``vocabulary/`` (reuse it with ``--vocab_dir`` to transform new days with the same ids) and
``preprocess_report.json`` (rows per split, bad rows per reason with the first line numbers). The
output is built in a temporary directory next to ``OUTPUT_DIR`` and renamed into place at the
end: a failed run leaves an existing ``OUTPUT_DIR`` untouched.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: a stop signal while they run counts (tf_dlrm/io/early_stop.py)
    from tf_dlrm.io.early_stop import stop_while_starting

    stop_while_starting("preprocessing.criteo")

import contextlib
import dataclasses
import glob
import json
import logging
import os
import sys
import time

import numpy as np

from tf_dlrm.data.fractions import check_fractions, command_line_valid_fraction
from tf_dlrm.data.layout import nvidia_spec
from tf_dlrm.data.split_binary import SplitBinaryWriter
from tf_dlrm.io.publish import staged_output
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import categorical_dtype_for

from preprocessing.criteo_format import NUM_CATEGORICAL, NUM_INTEGER
from preprocessing.splits import SPLIT_RULES, TRAIN, make_plan
from preprocessing.vocabulary import Vocabulary, VocabularyError

ENGINES = ("local", "spark")
SPEC_FILE = "feature_spec.yaml"
REPORT_FILE = "preprocess_report.json"
VOCABULARY_DIR = "vocabulary"
TRANSFORM = {
    "label": "0/1 -> bool",
    "numerical": "I1..I13: missing -> 0, negative -> 0, then log(1 + x) in float64, stored float16",
    "categorical": (
        "C1..C26 (8-hex-digit hashes): id 0 missing, id 1 rare (training count < frequency_threshold) or unseen, "
        "ids 2.. values with training count >= frequency_threshold by descending count, ties by hash ascending"
    ),
}

log = logging.getLogger("preprocessing.criteo")


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """Everything one run needs; checked on construction."""

    inputs: tuple[str, ...]
    output_dir: str
    frequency_threshold: int | None = None  # None: 1, or the --vocab_dir vocabulary's threshold
    engine: str = "local"
    split: str = "fraction"
    test_fraction: float = 0.1
    valid_fraction: float = 0.0  # --split=fraction: > 0 writes a validation split before the test rows
    vocab_dir: str | None = None
    strict: bool = False
    num_workers: int = 0
    spark_master: str = "local[*]"
    block_bytes: int = 1 << 20  # bytes parsed at a time (tests use small blocks)
    keys: str = "vocabulary"  # or "hashed": raw int64 keys for dynamic tables (preprocessing.hashed_keys)
    # --keys=hashed: each dynamic table's capacity in rows per rank; None: from the data (dynamic_capacity_of)
    dynamic_capacity: int | None = None

    def __post_init__(self):
        if not self.inputs:
            raise ValueError("--input: expected one or more files (comma-separated, globs allowed). Received: none")
        if not self.output_dir:
            raise ValueError("--output_dir: expected a directory. Received: ''")
        if self.frequency_threshold is not None and self.frequency_threshold < 0:
            raise ValueError(f"--frequency_threshold must be >= 0. Received: frequency_threshold={self.frequency_threshold}")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {list(ENGINES)}. Received: engine={self.engine!r}")
        if self.split not in SPLIT_RULES:
            raise ValueError(f"--split must be one of {list(SPLIT_RULES)}. Received: split={self.split!r}")
        check_fractions(self.test_fraction, self.valid_fraction)
        if self.valid_fraction and self.split != "fraction":
            raise ValueError(f"--valid_fraction applies to --split=fraction only. Received: split={self.split!r}, "
                             f"valid_fraction={self.valid_fraction}")
        if self.keys not in ("vocabulary", "hashed"):
            raise ValueError(f"--keys must be vocabulary or hashed. Received: keys={self.keys!r}")
        if self.keys == "hashed" and (self.vocab_dir or self.frequency_threshold is not None):
            raise ValueError("--keys=hashed builds no vocabulary: leave out --vocab_dir and --frequency_threshold. "
                             f"Received: vocab_dir={self.vocab_dir!r}, frequency_threshold={self.frequency_threshold}")
        if self.dynamic_capacity is not None and self.dynamic_capacity <= 0:
            raise ValueError(f"--dynamic_capacity must be > 0. Received: dynamic_capacity={self.dynamic_capacity}")


def expand_inputs(patterns) -> tuple[str, ...]:
    """Comma-separated paths or glob patterns -> paths (a glob's matches sorted); missing ones fail."""
    paths = []
    for pattern in patterns:
        if "://" in pattern:
            paths.append(pattern)
        elif glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern))
            if not matches:
                raise FileNotFoundError(f"--input: no file matches {pattern!r}")
            paths.extend(matches)
        elif not os.path.isfile(pattern):
            raise FileNotFoundError(f"--input: file not found: {pattern}")
        else:
            paths.append(pattern)
    return tuple(paths)


def _make_engine(config: PreprocessConfig, spark):
    if config.engine == "local":
        from preprocessing.local_engine import LocalEngine

        return LocalEngine(num_workers=config.num_workers, block_bytes=config.block_bytes)
    from preprocessing.spark_engine import SparkEngine

    return SparkEngine(spark=spark, master=config.spark_master, block_bytes=config.block_bytes)


def preprocess(config: PreprocessConfig, spark=None) -> dict:
    """Runs the whole preprocessing; returns the report written to ``preprocess_report.json``.

    Args:
        config: the run's settings.
        spark: an existing SparkSession for ``engine="spark"`` (else one is started on
            ``config.spark_master`` and stopped at the end).

    Raises:
        CriteoFormatError: an input is not Criteo-shaped.
        BadRowError: ``strict`` and a bad row (names file and line).
        ValueError, FileNotFoundError, FileExistsError: bad settings, naming the flag.
    """
    paths = expand_inputs(config.inputs)
    inputs = [*paths, config.vocab_dir]
    with staged_output(config.output_dir, "--output_dir", "preprocessing.criteo", inputs) as workspace:
        return _preprocess_into(workspace, paths, config, spark)


def _preprocess_into(workspace: str, paths, config: PreprocessConfig, spark) -> dict:
    """The three passes, writing the dataset into ``workspace`` (published by the caller)."""
    vocabulary = None
    if config.vocab_dir:
        vocabulary = Vocabulary.load(config.vocab_dir, NUM_CATEGORICAL)
        if config.frequency_threshold not in (None, vocabulary.frequency_threshold):
            raise VocabularyError(
                f"--frequency_threshold={config.frequency_threshold} differs from the threshold "
                f"{vocabulary.frequency_threshold} of --vocab_dir={config.vocab_dir}; leave the flag out"
            )
    threshold = vocabulary.frequency_threshold if vocabulary else (1 if config.frequency_threshold is None else config.frequency_threshold)
    umask = os.umask(0)
    os.umask(umask)
    engine = None
    try:
        engine = _make_engine(config, spark)
        started = time.perf_counter()
        files = engine.describe(paths)
        plan = make_plan(files, config.split, config.test_fraction, config.valid_fraction)
        log.info("pass 0 (formats, %d data lines): %.1fs", sum(f.data_lines for f in files), time.perf_counter() - started)
        counted_rows = None
        hashed = config.keys == "hashed"
        if hashed:
            from preprocessing.hashed_keys import HashedKeys

            vocabulary = HashedKeys()
        if vocabulary is None:
            started = time.perf_counter()
            counts, counted_rows = engine.count(files, plan, config.strict, threshold)
            if counted_rows == 0:
                raise ValueError(
                    f"No valid training rows to count frequencies on (split={config.split}, inputs={list(paths)}); "
                    f"see the bad-row reasons with --strict"
                )
            vocabulary = Vocabulary.from_counts(counts, NUM_CATEGORICAL, threshold)
            log.info("pass 1 (counts over %d training rows): %.1fs", counted_rows, time.perf_counter() - started)
        cardinalities = [1] * NUM_CATEGORICAL if hashed else vocabulary.cardinalities  # hashed: replaced below
        dtypes = [np.dtype(np.int64)] * NUM_CATEGORICAL if hashed else [categorical_dtype_for(c) for c in cardinalities]
        spec = nvidia_spec(
            NUM_INTEGER, cardinalities, splits=plan.names, base_directory=workspace,
            metadata={
                "source": "preprocessing.criteo",
                "transform": dict(TRANSFORM),
                "frequency_threshold": threshold,
                "split": plan.metadata(),
                "inputs": [os.path.basename(p) for p in paths],
                "vocabulary": f"{VOCABULARY_DIR}/manifest.json",
            },
        )
        if hashed:
            _make_dynamic(spec, config.dynamic_capacity or 1)  # capacity None: sized once the keys are written
        started = time.perf_counter()
        with contextlib.ExitStack() as stack:
            writers = {split: stack.enter_context(SplitBinaryWriter(spec, split)) for split in plan.names}

            def sink(split, label, numerical, ids):
                writers[split].append(label, numerical, ids)

            tally = engine.transform(files, plan, vocabulary, dtypes, sink, config.strict, workspace)
            rows = {split: writer.num_samples for split, writer in writers.items()}
        log.info("pass 2 (transform, %s rows): %.1fs", rows, time.perf_counter() - started)
        spec.metadata["num_samples"] = rows
        if hashed and config.dynamic_capacity is None:
            log.info("dynamic tables sized from the training keys: %s", _size_dynamic_tables(spec))
        if not hashed:
            vocabulary.save(os.path.join(workspace, VOCABULARY_DIR))
        spec.save(os.path.join(workspace, SPEC_FILE))
        os.chmod(os.path.join(workspace, SPEC_FILE), 0o666 & ~umask)  # save() writes through a private mkstemp
        FeatureSpec.load(os.path.join(workspace, SPEC_FILE), check_files=True)
        report = {
            "inputs": [
                {"file": f.path, "format": f.input_format.name, "header": f.input_format.header,
                 "compressed": f.compressed, "data_lines": f.data_lines}
                for f in files
            ],
            "split": plan.metadata(),
            "rows": rows,
            "training_rows_counted": counted_rows,
            "frequency_threshold": None if hashed else threshold,
            "keys": config.keys,
            "cardinalities": None if hashed else cardinalities,
            "bad_rows": tally.to_json([f.path for f in files]),
        }
        with open(os.path.join(workspace, REPORT_FILE), "w", encoding="utf-8") as stream:
            json.dump(report, stream, indent=2)
            stream.write("\n")
        return report
    finally:
        if engine is not None:
            # After a failure or a stop signal the engine ends its workers without waiting on them
            # (a Spark gateway may be cut in the middle of a call).
            engine.close(failed=sys.exc_info()[0] is not None)


def _size_dynamic_tables(spec) -> dict:
    """Each dynamic table's capacity from the distinct keys of its training file
    (:func:`preprocessing.hashed_keys.capacity_from_keys`); returns them by feature."""
    from preprocessing.hashed_keys import capacity_from_keys

    sized = {}
    for chunk in spec.chunks(TRAIN):
        name = chunk["features"][0]
        if spec.feature_spec[name].get("dynamic"):
            spec.feature_spec[name].update(capacity_from_keys(spec.resolve(chunk["files"][0])))
            sized[name] = spec.feature_spec[name]["capacity"]
    return sized


def _make_dynamic(spec, capacity: int) -> None:
    """--keys=hashed: every categorical feature becomes a dynamic table of int64 raw keys."""
    from preprocessing.hashed_keys import TRANSFORM as HASHED_TRANSFORM

    for name in spec.categorical_features:
        spec.feature_spec[name] = {"dtype": "int64", "dynamic": True, "capacity": capacity, "eviction": "lru"}
    spec.metadata.pop("vocabulary", None)
    spec.metadata.pop("frequency_threshold", None)
    spec.metadata["transform"] = {**spec.metadata["transform"], "categorical": HASHED_TRANSFORM}
    spec.metadata["keys"] = "hashed"


# ----------------------------------------------------------------------------- command line


def _define_flags():
    from absl import flags

    flags.DEFINE_list("input", None, "Criteo files: comma-separated paths or globs (TSV or CSV with header, plain or .gz).")
    flags.DEFINE_string("output_dir", None, "Where feature_spec.yaml and the split_binary files go.")
    flags.DEFINE_integer("frequency_threshold", None, "Values seen fewer times in training share the rare id 1 (default 1).")
    flags.DEFINE_enum("engine", "local", list(ENGINES), "local: all cores of this machine; spark: PySpark.")
    flags.DEFINE_enum("split", "fraction", list(SPLIT_RULES), "fraction: last --test_fraction of rows is test; "
                      "days: day_0..22 train, day_23 halves test/validation; none: all train.")
    flags.DEFINE_float("test_fraction", 0.1, "--split=fraction: share of rows (from the end) that go to test.")
    flags.DEFINE_float("valid_fraction", None, "--split=fraction: share of rows, just before the test rows, that go "
                       "to a 'validation' split, the one training chooses by (default: as --test_fraction; 0: none, two splits).")
    flags.DEFINE_string("vocab_dir", None, "Reuse the vocabulary of an earlier run (its OUTPUT_DIR/vocabulary).")
    flags.DEFINE_bool("strict", False, "Stop at the first bad row instead of skipping and counting it.")
    flags.DEFINE_integer("num_workers", 0, "--engine=local: worker processes (0: all cores).")
    flags.DEFINE_string("spark_master", "local[*]", "--engine=spark: the Spark master URL.")
    flags.DEFINE_enum("keys", "vocabulary", ["vocabulary", "hashed"], "vocabulary: ids by training frequency "
                      "(fixed tables); hashed: raw 64-bit keys per feature, no vocabulary pass (dynamic tables).")
    flags.DEFINE_integer("dynamic_capacity", None, "--keys=hashed: capacity (rows per rank) of every dynamic table; "
                         "default: from the data (its distinct training keys with a quarter more, shared by all ranks).")
    flags.mark_flags_as_required(["input", "output_dir"])
    return flags.FLAGS


def main(argv) -> None:
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    values = flags.FLAGS
    try:
        config = PreprocessConfig(
            inputs=tuple(values.input),
            output_dir=values.output_dir,
            frequency_threshold=values.frequency_threshold,
            engine=values.engine,
            split=values.split,
            test_fraction=values.test_fraction,
            # --split=days writes its own validation half of day 23; --split=none no held-out split.
            valid_fraction=command_line_valid_fraction(values.valid_fraction, values.test_fraction)
            if values.split == "fraction" or values.valid_fraction is not None else 0.0,
            vocab_dir=values.vocab_dir,
            strict=values.strict,
            num_workers=values.num_workers,
            spark_master=values.spark_master,
            keys=values.keys,
            dynamic_capacity=values.dynamic_capacity,
        )
    except ValueError as error:
        sys.exit(f"preprocessing.criteo: error: {error}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        report = preprocess(config)
    except (ValueError, OSError, ImportError, RuntimeError) as error:  # the message says what to fix
        sys.exit(f"preprocessing.criteo: error: {error}")
    print(json.dumps({"output_dir": config.output_dir, "rows": report["rows"],
                      "bad_rows": report["bad_rows"]["total"], "cardinalities": report["cardinalities"]}))


def run() -> None:
    """Console script ``tf-dlrm-preprocess-criteo``."""
    from absl import app

    from tf_dlrm.io.stop_signals import stopping_cleanly

    _define_flags()
    if any(argument in ("-h", "--help", "-?", "--helpshort") for argument in sys.argv[1:]):
        # Help that was asked for is no failure (absl's own --help exits 1).
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
    with stopping_cleanly("preprocessing.criteo"):
        app.run(main)


if __name__ == "__main__":
    run()
