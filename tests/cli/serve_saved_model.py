"""Serves an exported DLRM with TensorFlow alone: ``python serve_saved_model.py SAVED_MODEL BATCH.npz OUT.npy``.

Imports neither tf_dlrm nor Keras (checked at the end): the SavedModel must stand on its own.
"""

from __future__ import annotations

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
    leaked = sorted(name for name in sys.modules if name == "tf_dlrm" or name.startswith("tf_dlrm."))
    if leaked:
        sys.exit(f"serving imported {leaked}")


if __name__ == "__main__":
    main()
