"""A learnable synthetic click dataset for a FeatureSpec, with its ground-truth model's own AUC.

Samples are drawn like click logs: categorical ids follow a power law (Zipf-like, a few ids are very
frequent) through a random permutation per table, so the frequent ids are not simply the small ones;
numerical features are heavy-tailed counts stored after Criteo's ``log(1 + x)`` transform. Labels
are ``Bernoulli(sigmoid(logit))`` from a hidden model a DLRM can represent::

    logit = bias + sum_j w_j * standardised(num_j)            (what the bottom MLP sees)
                 + sum_t e_t[id_t]                              (one scalar per id: an embedding)
                 + sum_(a, b) <v_a[id_a], v_b[id_b]>            (4-d hidden vectors: dot interaction)

Per-id effects shrink with the id's popularity rank, ``(1 + rank / head) ** -decay``, so the
signal sits on ids seen often enough to be learnt from a few hundred thousand samples. The three
parts are scaled on a calibration sample to fixed shares of a target logit spread, and the bias is
set so the mean click probability hits ``positive_rate``.

Splits: ``train``, ``validation`` (``--num_valid_samples``: what a run chooses its state by) and, with
``--num_test_samples``, ``test`` (NVIDIA's name for the held-out split a run reports). ``metadata.oracle_valid_auc``
is the exact AUC of the true probabilities on the generated validation labels, ``oracle_test_auc`` on the test
labels: the best a model can do on each.

Usage::

    python -m tf_dlrm.data.synthetic --feature_spec=feature_specs/synthetic_small.yaml \\
        --output_dir=/tmp/synthetic --num_train_samples=200000 --num_valid_samples=50000 \\
        --num_test_samples=50000 --seed=1
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: a stop signal while they run counts (tf_dlrm/io/early_stop.py)
    from tf_dlrm.io.early_stop import stop_while_starting

    stop_while_starting("tf_dlrm.data.synthetic")

import math
import os
import sys
from typing import Sequence

import numpy as np

from tf_dlrm import metrics
from tf_dlrm.data.hidden_model import HIDDEN_DIM, GeneratorConfig, HiddenModel, sigmoid
from tf_dlrm.data.layout import with_split_binary_sources
from tf_dlrm.data.split_binary import SplitBinaryWriter
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.spec.format import TEST_SPLIT, TRAIN_SPLIT
from tf_dlrm.io.publish import staged_output

DEFAULT_BLOCK_SIZE = 1 << 18
VALIDATION_SPLIT = "validation"
# Each split draws from its own random stream; the validation split keeps the stream the held-out split had when
# it was the only one, so the same seed still gives the same training and validation samples.
_SPLIT_STREAMS = {TRAIN_SPLIT: 1, VALIDATION_SPLIT: 2, TEST_SPLIT: 3}


def generate(
    spec: FeatureSpec,
    output_dir: str,
    num_train_samples: int,
    num_valid_samples: int,
    seed: int = 0,
    config: GeneratorConfig = GeneratorConfig(),
    block_size: int = DEFAULT_BLOCK_SIZE,
    num_test_samples: int = 0,
) -> FeatureSpec:
    """Writes a synthetic dataset for ``spec`` under ``output_dir`` and returns its spec.

    Writes ``train/``, ``validation/`` and (``num_test_samples`` > 0) ``test/`` in NVIDIA's split_binary layout, then
    ``feature_spec.yaml``, into a temporary sibling published by a rename, so an interrupted run
    leaves nothing half written. The same arguments give byte-identical files.

    Raises:
        ValueError: on a negative sample count or a non-positive block size.
        OutputDirectoryError: ``output_dir`` holds files this tool did not write, or the input spec.
    """
    for name, value in (("num_train_samples", num_train_samples), ("num_valid_samples", num_valid_samples),
                        ("num_test_samples", num_test_samples)):
        if value < 0:
            raise ValueError(f"Expected {name} >= 0. Received: {name}={value}")
    if block_size <= 0:
        raise ValueError(f"Expected block_size > 0. Received: block_size={block_size}")
    output_dir = os.path.abspath(output_dir)
    inputs = [spec.source] if os.path.isfile(str(spec.source)) else []
    # Staged in a temporary sibling and published by one rename (tf_dlrm.io.publish).
    with staged_output(output_dir, "--output_dir", "tf_dlrm.data.synthetic", inputs) as workspace:
        counts = {TRAIN_SPLIT: num_train_samples, VALIDATION_SPLIT: num_valid_samples}
        if num_test_samples:
            counts[TEST_SPLIT] = num_test_samples
        out_spec = _generate_into(spec, workspace, counts, seed, config, block_size)
    out_spec.base_directory = output_dir
    out_spec.source = os.path.join(output_dir, "feature_spec.yaml")
    return out_spec


def _generate_into(spec, workspace, counts, seed, config, block_size) -> FeatureSpec:
    """The body of :func:`generate`, writing into ``workspace``."""
    # --variable_hotness: every multi-hot feature holds 1 to hotness ids a row, stored with a lengths file.
    variable = [name for name in spec.categorical_features if spec.hotness(name) > 1] if config.variable_hotness else []
    if variable and config.hashed_keys:
        raise ValueError("Expected at most one of variable_hotness and hashed_keys. Received: both")
    out_spec = with_split_binary_sources(spec, list(counts), workspace, variable)
    model = HiddenModel(out_spec, seed, config)
    if config.hashed_keys:
        _make_dynamic(out_spec)
    writers = {}
    try:
        # Every split stays as .partial files until all are complete.
        for split in counts:
            writers[split] = SplitBinaryWriter(out_spec, split)
        held_out = {split: ([], []) for split in counts if split != TRAIN_SPLIT}  # labels, true probabilities
        train_positives = 0
        for split, writer in writers.items():
            for block, start in enumerate(range(0, counts[split], block_size)):
                rng = np.random.default_rng([seed, _SPLIT_STREAMS[split], block])
                count = min(block_size, counts[split] - start)
                numerical, ranks, ids = model.sample(rng, count)
                probabilities = sigmoid(model.logits(numerical, ranks))
                labels = rng.random(count) < probabilities
                if config.hashed_keys:
                    ids = _as_keys(ids)
                writer.append(labels, numerical if model.num_numerical else None, ids)
                if split in held_out:
                    held_out[split][0].append(labels)
                    held_out[split][1].append(probabilities)
                else:
                    train_positives += int(labels.sum())
        for writer in writers.values():
            writer.close()
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    oracle = {}
    for split, short in ((VALIDATION_SPLIT, "valid"), (TEST_SPLIT, "test")):
        if split in held_out:
            oracle |= _oracle_figures(short, *held_out[split])
    num_train_samples = counts[TRAIN_SPLIT]
    out_spec.metadata.update(
        {
            **oracle,
            "num_train_samples": int(num_train_samples),
            "num_valid_samples": int(counts[VALIDATION_SPLIT]),
            **({"num_test_samples": int(counts[TEST_SPLIT])} if TEST_SPLIT in counts else {}),
            "train_positive_rate": round(train_positives / num_train_samples, 6) if num_train_samples else None,
            "seed": int(seed),
            "generator": (
                f"tf_dlrm.data.synthetic: zipf({config.zipf_exponent}) ids, log1p(lognormal counts) numericals, "
                f"labels ~ Bernoulli(sigmoid(linear numerical + per-id effects + {HIDDEN_DIM}-d pairwise dots))"
                + (", multi-hot rows of 1 to hotness ids (power-law lengths)" if variable else "")
            ),
        }
    )
    out_spec.save(os.path.join(workspace, "feature_spec.yaml"))
    return out_spec


def _oracle_figures(short: str, labels: list, probabilities: list) -> dict:
    """``oracle_<short>_auc`` and ``oracle_<short>_logloss``: the hidden model's own figures on a split's labels."""
    labels = np.concatenate(labels) if labels else np.zeros(0, bool)
    probabilities = np.concatenate(probabilities) if probabilities else np.zeros(0)
    auc = metrics.exact_auc(labels, probabilities) if labels.size else float("nan")
    return {
        f"oracle_{short}_auc": None if math.isnan(auc) else round(float(auc), 6),
        f"oracle_{short}_logloss": round(metrics.logloss(labels, probabilities), 6) if labels.size else None,
    }


def _as_keys(ids: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``--hashed_keys``: id ``i`` of table ``t`` becomes the int64 key ``mix64((t << 33) | i)``
    (SplitMix64, a bijection: distinct ids stay distinct, spread over the whole int64 range). The
    ids stay Zipf-distributed, so new keys keep appearing over the stream (the tail's first sightings)."""
    from tf_dlrm.sharding.dynamic_routing import mix64

    return [mix64(np.asarray(column, np.int64) | np.int64(table << 33)).view(np.int64) for table, column in enumerate(ids)]


def _make_dynamic(spec: FeatureSpec) -> None:
    """Every categorical feature becomes a dynamic table of int64 keys with capacity = its vocabulary."""
    for name in spec.categorical_features:
        properties = spec.feature_spec[name]
        spec.feature_spec[name] = {**properties, "dtype": "int64", "dynamic": True,
                                   "capacity": int(properties["cardinality"]), "eviction": "lru"}


# ---------------------------------------------------------------------- command line


def _define_flags() -> None:
    # Flags are defined only when run as a program, so importing this module (e.g. from main.py,
    # which has its own --feature_spec) never clashes.
    from absl import flags

    flags.DEFINE_string("feature_spec", None, "FeatureSpec yaml giving features and cardinalities (its sources are ignored).")
    flags.DEFINE_string("output_dir", None, "Directory for train/, validation/, test/ and feature_spec.yaml.")
    flags.DEFINE_integer("num_train_samples", 1_000_000, "Training samples.", lower_bound=0)
    flags.DEFINE_integer("num_valid_samples", 100_000, "Validation samples (the 'validation' split: what a run "
                         "chooses its state by).", lower_bound=0)
    flags.DEFINE_integer("num_test_samples", 0, "Test samples (the 'test' split, which a run reports and never "
                         "chooses by; 0: none).", lower_bound=0)
    flags.DEFINE_integer("seed", 0, "Seed of the hidden model and the samples.")
    flags.DEFINE_float("zipf_exponent", GeneratorConfig.zipf_exponent, "Power-law exponent of id popularity.")
    flags.DEFINE_float("positive_rate", GeneratorConfig.positive_rate, "Mean click probability.")
    flags.DEFINE_bool("hashed_keys", False, "Write sparse int64 keys and a spec of dynamic tables (capacity = vocabulary).")
    flags.DEFINE_bool("variable_hotness", False, "Multi-hot rows of 1 to hotness ids (power-law lengths, as NVIDIA's "
                      "generator draws them), written with a lengths file per feature and ragged: true.")
    flags.DEFINE_integer("block_size", DEFAULT_BLOCK_SIZE, "Samples generated per block (bounds memory).", lower_bound=1)
    flags.mark_flags_as_required(["feature_spec", "output_dir"])


def main(argv: Sequence[str]) -> None:
    from absl import flags

    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {list(argv[1:])}")
    options = flags.FLAGS
    try:
        spec = FeatureSpec.load(options.feature_spec, check_files=False)
        config = GeneratorConfig(zipf_exponent=options.zipf_exponent, positive_rate=options.positive_rate,
                                 hashed_keys=options.hashed_keys, variable_hotness=options.variable_hotness)
        written = generate(
            spec, options.output_dir, options.num_train_samples, options.num_valid_samples,
            seed=options.seed, config=config, block_size=options.block_size, num_test_samples=options.num_test_samples,
        )
    except (ValueError, OSError) as error:  # FeatureSpecError is a ValueError
        sys.exit(f"error: {error}")
    test = options.num_test_samples
    print(
        f"wrote {options.num_train_samples} train + {options.num_valid_samples} valid"
        f"{f' + {test} test' if test else ''} samples to {written.source}; "
        f"oracle_valid_auc={written.metadata['oracle_valid_auc']}"
        + (f", oracle_test_auc={written.metadata['oracle_test_auc']}" if test else "")
    )


def run() -> None:
    """Console script entry point ``tf-dlrm-synthetic``."""
    from absl import app

    from tf_dlrm.io.stop_signals import stopping_cleanly

    _define_flags()
    with stopping_cleanly("tf_dlrm.data.synthetic"):
        app.run(main)


if __name__ == "__main__":
    run()
