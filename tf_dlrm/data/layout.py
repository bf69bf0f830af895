"""NVIDIA's split_binary file layout: which files a spec's splits live in, and their names.

Per split ``<split>/label.bin``, ``<split>/numerical.bin`` and one ``<split>/cat_<i>.bin`` per
categorical feature (NVIDIA names the features themselves ``cat_<i>.bin``); categorical dtypes follow
:func:`tf_dlrm.spec.format.categorical_dtype_for`.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

from tf_dlrm.spec.format import CATEGORICAL_CHANNEL, LABEL_CHANNEL, NUMERICAL_CHANNEL, SPLIT_BINARY, TEST_SPLIT, TRAIN_SPLIT, categorical_dtype_for
from tf_dlrm.spec.feature_spec import FeatureSpec


def nvidia_spec(
    num_numerical: int,
    cardinalities: Sequence[int],
    splits: Sequence[str] = (TRAIN_SPLIT, TEST_SPLIT),
    numerical_dtype: str = "float16",
    metadata: Mapping[str, Any] | None = None,
    base_directory: str = ".",
) -> FeatureSpec:
    """A spec with NVIDIA's names and files: label, num_0.., cat_0.bin.., <split>/cat_0.bin..."""
    numerical = [f"num_{i}" for i in range(num_numerical)]
    categorical = [f"cat_{i}.bin" for i in range(len(cardinalities))]
    features: dict[str, dict[str, Any]] = {"label": {"dtype": "bool"}}
    features.update({name: {"dtype": numerical_dtype} for name in numerical})
    features.update({name: {"dtype": "int64", "cardinality": int(c)} for name, c in zip(categorical, cardinalities)})
    channels = {LABEL_CHANNEL: ["label"], NUMERICAL_CHANNEL: numerical, CATEGORICAL_CHANNEL: categorical}
    return with_split_binary_sources(FeatureSpec(features, channels, metadata=metadata), splits, base_directory)


def with_split_binary_sources(spec: FeatureSpec, splits: Sequence[str], base_directory: str,
                              variable: Sequence[str] = (), weighted: Sequence[str] = ()) -> FeatureSpec:
    """A copy of ``spec`` whose splits are split_binary files in NVIDIA's per-split layout.

    File names are derived from feature names; categorical dtypes follow the cardinality rule. The
    features named in ``variable`` are stored with a lengths file (``<file stem>.lengths.bin``, rows
    of 0 to hotness ids: :mod:`tf_dlrm.data.ragged_split_binary`) and marked ``ragged: true``; those in
    ``weighted`` with a weights file too (``<file stem>.weights.bin``).
    """
    features = copy.deepcopy(spec.feature_spec)
    for name in spec.categorical_features:
        if features[name].get("dynamic") is True:
            continue  # raw keys of a dynamic table keep their declared dtype (no id bound to shrink it to)
        features[name]["dtype"] = str(categorical_dtype_for(int(features[name]["cardinality"])))
    features[spec.label_feature]["dtype"] = "bool"
    for name in variable:
        features[name]["ragged"] = True
    sources = {}
    for split in splits:
        chunks = [{"type": SPLIT_BINARY, "features": [spec.label_feature], "files": [f"{split}/label.bin"]}]
        if spec.numerical_features:
            chunks.append({"type": SPLIT_BINARY, "features": spec.numerical_features, "files": [f"{split}/numerical.bin"]})
        for index, name in enumerate(spec.categorical_features):
            file = f"{split}/{categorical_file_name(name, index)}"
            chunk = {"type": SPLIT_BINARY, "features": [name], "files": [file]}
            stem = file[:-len(".bin")] if file.endswith(".bin") else file
            if name in variable:
                chunk["lengths"] = stem + ".lengths.bin" if file.endswith(".bin") else file + ".lengths"
            if name in weighted:
                chunk["weights"] = stem + ".weights.bin"
            chunks.append(chunk)
        sources[split] = chunks
    return FeatureSpec(features, spec.channel_spec, sources, spec.metadata, base_directory=base_directory)


def categorical_file_name(feature: str, index: int) -> str:
    """NVIDIA names categorical features 'cat_<i>.bin' and uses that as the file name."""
    if feature.endswith(".bin"):
        return feature
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in feature)
    return f"cat_{index}_{safe}.bin"
