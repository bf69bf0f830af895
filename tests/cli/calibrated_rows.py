"""What ``--mode=eval`` scores, row by row: ``python tests/cli/calibrated_rows.py BATCH.npz EVAL.npz MAIN_FLAGS...``.

Restores the checkpoint of the flags as ``--mode=eval`` does (:func:`tf_dlrm.cli.modes.restore`, the calibration of
:func:`tf_dlrm.cli.modes.checkpoint_calibration`), reads the first global batch of the validation split (make
``--valid_batch_size`` the split's size for all of it) and writes ``BATCH.npz``, the SavedModel's inputs of those rows
(``tests/checkpoint/checkpoint_worker.serving_batch``), and ``EVAL.npz``: ``probability`` (the calibrated
probabilities of the model's logits, as evaluation computes them), ``logit`` and ``label``. One process.
"""

from __future__ import annotations

import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checkpoint"))

from checkpoint_worker import parse, serving_batch  # noqa: E402


def main(batch: str, out: str, argv: list[str]) -> None:
    from tf_dlrm.cli import builder, modes
    from tf_dlrm.cli.evaluation_splits import resolve

    config = parse(argv)
    session = modes.open_session(config)
    header = modes.restore(session)
    calibration = modes.checkpoint_calibration(header, config, session.reporter)
    split = resolve(config.valid_split, config.test_split, session.spec.splits).valid
    reader = builder.make_reader(session.spec, split, config.valid_batch_size, session.env, session.model.input_modes,
                                 False, config.seed, config.dataset_type)
    features, label = next(iter(reader.dataset(epoch=0)))
    rows = session.trainer.predict_local(features, label).numpy()  # (probability, label, logit), as evaluate reads them
    logits = rows[:, 2]
    probabilities = calibration.probabilities(logits) if calibration is not None else rows[:, 0].astype(np.float64)
    np.savez(batch, **serving_batch(session.spec, features))
    np.savez(out, probability=probabilities, logit=logits, label=rows[:, 1])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
