"""Serves an exported DLRM with TensorFlow alone: ``python serve_saved_model.py SAVED_MODEL BATCH.npz OUT.npy [BAD.json]``.

Imports neither tf_dlrm nor Keras (checked at the end): the SavedModel must stand on its own. With
``BAD.json``, also serves wrong variants of the batch and writes ``{case: the error's first line
holding "assertion failed", or "scored" when it was not refused}``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def main():
    saved_model, batch_path, out_path = sys.argv[1:4]
    batch = np.load(batch_path, allow_pickle=False)
    served = tf.saved_model.load(saved_model)
    signature = served.signatures["serving_default"]
    outputs = signature(numerical=tf.constant(batch["numerical"], tf.float32), categorical=tf.constant(batch["categorical"], tf.int64))
    np.save(out_path, outputs["probability"].numpy())
    if len(sys.argv) > 4:
        with open(os.path.join(saved_model, "tf_dlrm_serving.json")) as handle:
            cardinalities = json.load(handle)["cardinalities"]
        numerical, categorical = batch["numerical"].astype(np.float32), batch["categorical"].astype(np.int64)
        outside = categorical.copy()
        outside[5, 2] = cardinalities[2]
        cases = {
            "categorical_9_columns": (numerical, np.concatenate([categorical, categorical[:, :1]], axis=1)),
            "numerical_12_columns": (numerical[:, 1:], categorical),
            "batch_sizes_differ": (numerical, categorical[1:]),
            "id_outside": (numerical, outside),
            "categorical_rank_1": (numerical, categorical[:, 0]),
        }
        found = {}
        for name, (numerical_batch, categorical_batch) in cases.items():
            try:
                signature(numerical=tf.constant(numerical_batch), categorical=tf.constant(categorical_batch))
                found[name] = "scored"
            except tf.errors.InvalidArgumentError as error:
                lines = [line for line in str(error).splitlines() if "assertion failed" in line]
                # TensorFlow escapes the quotes of the message.
                found[name] = lines[0].strip().replace("\\'", "'") if lines else str(error)
        with open(sys.argv[4], "w") as handle:
            json.dump(found, handle, indent=1)
    leaked = sorted(name for name in sys.modules if name == "tf_dlrm" or name.startswith("tf_dlrm."))
    if leaked:
        sys.exit(f"serving imported {leaked}")


if __name__ == "__main__":
    main()
