"""Serves an exported DLRM with TensorFlow alone:
``python serve_saved_model.py SAVED_MODEL BATCH.npz OUT.npy [BAD.json] [MORE.npz=MORE_OUT.npy ...] [-- SAVED_MODEL ...]``.

tf_dlrm cannot be imported here (its paths and the virtualenv's editable-install finder are removed
first; checked), so neither its Python code nor its kernel library can be loaded: the SavedModel must
stand on its own. The batch holds the signature's inputs by name (``numerical`` float32, every other int64)
and ``probability`` is read. With ``BAD.json``, also serves wrong variants of the batch (:func:`_bad_cases`)
and writes ``{case: the error's first line holding "assertion failed", or "scored" when it was not refused}``. Several SavedModels in one
interpreter: their argument groups separated by ``--`` (each loaded by tf.saved_model.load on its own).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

# Whatever PYTHONPATH and the working directory say: no path holding tf_dlrm, no finder installed by
# `pip install -e` (a .pth file of the virtualenv) that maps the name to a checkout.
sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or os.getcwd(), "tf_dlrm"))]
sys.meta_path[:] = [f for f in sys.meta_path if "tf_dlrm" not in getattr(f, "__module__", "") + repr(f)]
if importlib.util.find_spec("tf_dlrm") is not None:
    sys.exit("tf_dlrm is still importable in the serving process")

import numpy as np  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def _as_inputs(batch) -> dict:
    """The batch's arrays as the signature's dtypes (a ``tf.Tensor`` is passed as it is: a wrong dtype's case)."""
    return {name: array if isinstance(array, tf.Tensor) else tf.constant(array, tf.float32 if name == "numerical" else tf.int64)
            for name, array in batch.items()}


def _bad_cases(info: dict, batch: dict) -> dict:
    """Wrong variants of the batch, named ``<input>_<case>``, from ``tf_dlrm_serving.json``'s inputs: the
    numerical input one column short and float64; each one-hot input with two ids per sample, an id past its
    table (a raw key never seen, for a dynamic table), one sample short and int32; each fixed multi-hot input one
    id wider, an id past its table, one sample short and int32; each ragged input with a row longer than its
    hotness, row lengths that do not sum to the values and an id past its table."""
    numerical = batch["numerical"].astype(np.float32)
    cases = {"numerical_12_columns": {**batch, "numerical": numerical[:, 1:]},
             # Dtypes are the signature's own check (TensorFlow's message: the input's position among the sorted names).
             "numerical_float64": {**batch, "numerical": tf.constant(numerical, tf.float64)}}
    for name, entry in info.items():
        if "feature" not in entry:
            continue
        # A dynamic table's keys have no range: a key no table saw (far past any hashed one here) reads zeros.
        past = entry["cardinality"] if entry["cardinality"] is not None else 2**62 + 7
        if name.endswith("_row_lengths"):
            stem = name[:-len("_row_lengths")]
            values, lengths = batch[f"{stem}_values"], batch[name]
            longer = lengths.copy()
            longer[3] = entry["hotness"] + 1
            pad = np.zeros(entry["hotness"] + 1 - lengths[3], np.int64)
            start = int(lengths[:3].sum())
            cases[f"{stem}_row_too_long"] = {**batch, name: longer, f"{stem}_values": np.concatenate(
                [values[:start + lengths[3]], pad, values[start + lengths[3]:]])}
            cases[f"{stem}_lengths_sum"] = {**batch, f"{stem}_values": values[1:]}
            outside = values.copy()
            outside[start] = past  # sample 3's first id
            cases[f"{stem}_id_outside"] = {**batch, f"{stem}_values": outside}
        elif not name.endswith("_values"):
            ids = batch[name]
            outside = ids.copy()
            if ids.ndim == 1:
                outside[5] = past
                cases[f"{name}_two_ids"] = {**batch, name: np.stack([ids, ids], axis=1)}
            else:
                outside[3, 1] = past
                cases[f"{name}_wider"] = {**batch, name: np.concatenate([ids, ids[:, :1]], axis=1)}
            cases[f"{name}_id_outside"] = {**batch, name: outside}
            cases[f"{name}_batch_sizes_differ"] = {**batch, name: ids[1:]}
            cases[f"{name}_int32"] = {**batch, name: tf.constant(ids, tf.int32)}
    return cases


def main():
    groups, group = [], []
    for argument in sys.argv[1:] + ["--"]:
        if argument == "--":
            groups.append(group)
            group = []
        else:
            group.append(argument)
    for arguments in groups:
        serve(*arguments)
    leaked = sorted(name for name in sys.modules if name == "tf_dlrm" or name.startswith("tf_dlrm."))
    if leaked:
        sys.exit(f"serving imported {leaked}")


def serve(saved_model: str, batch_path: str, out_path: str, *more: str) -> None:
    extra = [argument.split("=", 1) for argument in more if "=" in argument]  # more IN.npz=OUT.npy
    bad_path = next((argument for argument in more if "=" not in argument), None)
    batch = dict(np.load(batch_path, allow_pickle=False))
    served = tf.saved_model.load(saved_model)
    signature = served.signatures["serving_default"]
    outputs = signature(**_as_inputs(batch))
    np.save(out_path, outputs["probability"].numpy())
    for more_in, more_out in extra:
        np.save(more_out, signature(**_as_inputs(dict(np.load(more_in, allow_pickle=False))))["probability"].numpy())
    if bad_path is not None:
        with open(os.path.join(saved_model, "tf_dlrm_serving.json")) as handle:
            cases = _bad_cases(json.load(handle)["inputs"], batch)
        found = {}
        for name, inputs in cases.items():
            try:
                signature(**_as_inputs(inputs))
                found[name] = "scored"
            except tf.errors.InvalidArgumentError as error:
                lines = [line for line in str(error).splitlines() if "assertion failed" in line or "was expected" in line]
                # TensorFlow escapes the quotes of the message.
                found[name] = lines[0].strip().replace("\\'", "'") if lines else str(error)
        with open(bad_path, "w") as handle:
            json.dump(found, handle, indent=1)


if __name__ == "__main__":
    main()
