"""Checks of a :class:`~tf_dlrm.spec.feature_spec.FeatureSpec`: its structure, and the data files it names.

Structure (:func:`validate_structure`): channels, feature dtypes and cardinalities, source chunks,
read from the spec's mappings alone. Files (:func:`check_files_exist`,
:func:`split_binary_problems`, :func:`check_split_binary_files`): every file a split names exists,
and a split_binary file holds a whole number of records, as many as every other file of its split.

Every function takes the spec and raises :class:`~tf_dlrm.spec.format.FeatureSpecError`
whose message names the spec file, the key, the feature and the data file at fault.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping

import numpy as np

from tf_dlrm.io import files
from tf_dlrm.spec import dynamic as dynamic_spec
from tf_dlrm.spec.format import (
    CHANNELS,
    CHUNK_KEYS,
    CHUNK_TYPES,
    COMBINERS,
    FEATURE_KEYS,
    FLOAT_DTYPES,
    INTEGER_DTYPES,
    LABEL_CHANNEL,
    SPLIT_BINARY,
    SUPPORTED_DTYPES,
    FeatureSpecError,
)


def _fail(spec, message: str) -> None:
    raise FeatureSpecError(f"{spec.source}: {message}")


def unknown_key_message(where: str, keys: Iterable[str], allowed: Iterable[str]) -> str | None:
    """None when every key is allowed; else one line naming the first unknown key and the nearest
    allowed one (a misspelt key would otherwise be ignored and its default used in silence)."""
    allowed = list(allowed)
    unknown = [key for key in keys if key not in allowed]
    if not unknown:
        return None
    key = unknown[0]
    nearest = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.0)
    hint = f"; did you mean '{nearest[0]}'?" if nearest else ""
    return f"{where}: unknown key '{key}'{hint} Allowed keys: {allowed}"


# ------------------------------------------------------------------ structure


def validate_structure(spec) -> None:
    """Checks channels, features and sources; opens no file."""
    _validate_channels(spec)
    _validate_features(spec)
    _validate_sources(spec)


def _validate_channels(spec) -> None:
    for channel, names in spec.channel_spec.items():
        if channel not in CHANNELS:
            _fail(spec, unknown_key_message("channel_spec", [channel], CHANNELS))
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            _fail(spec, f"channel_spec.{channel}: expected a list of feature names. Received: {names!r}")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            _fail(spec, f"channel_spec.{channel}: feature(s) {duplicates} listed more than once")
    labels = spec.channel_spec.get(LABEL_CHANNEL)
    if not labels or len(labels) != 1:
        _fail(spec, f"channel_spec.{LABEL_CHANNEL}: expected exactly one label feature. Received: {labels!r}")
    seen: dict[str, str] = {}
    for channel, names in spec.channel_spec.items():
        for name in names:
            if name not in spec.feature_spec:
                _fail(spec,
                      f"channel_spec.{channel}: feature '{name}' is not defined in feature_spec "
                      f"(defined: {sorted(spec.feature_spec)[:10]}{'...' if len(spec.feature_spec) > 10 else ''})")
            if name in seen:
                _fail(spec, f"feature '{name}' is in both channel '{seen[name]}' and channel '{channel}'")
            seen[name] = channel
    if not spec.categorical_features and not spec.numerical_features:
        _fail(spec, "channel_spec: needs at least one numerical or categorical feature")


def _validate_features(spec) -> None:
    categorical = set(spec.categorical_features)
    for name, properties in spec.feature_spec.items():
        where = f"feature_spec.{name}"
        if not isinstance(properties, Mapping):
            _fail(spec, f"{where}: expected a mapping with 'dtype'. Received: {properties!r}")
        unknown = unknown_key_message(f"{where} (feature '{name}')", properties, FEATURE_KEYS + dynamic_spec.KEYS)
        if unknown:
            _fail(spec, unknown)
        dtype = properties.get("dtype")
        if dtype not in SUPPORTED_DTYPES:
            _fail(spec, f"{where}.dtype: unsupported dtype {dtype!r}. Supported: {list(SUPPORTED_DTYPES)}")
        if name in categorical:
            _validate_categorical(spec, name, properties)
    numerical_dtypes = {spec.feature_spec[n]["dtype"] for n in spec.numerical_features}
    if numerical_dtypes - set(FLOAT_DTYPES):
        _fail(spec, f"numerical features need dtype float16 or float32. Received: {sorted(numerical_dtypes)}")
    if len(numerical_dtypes) > 1:
        _fail(spec, f"numerical features must share one dtype (they share one file). Received: {sorted(numerical_dtypes)}")


def _validate_categorical(spec, name: str, properties: Mapping[str, Any]) -> None:
    where, dtype = f"feature_spec.{name}", properties.get("dtype")
    dynamic_problem = dynamic_spec.problem(name, properties)
    if dynamic_problem:
        _fail(spec, f"{where}{dynamic_problem}")
    if dynamic_spec.is_dynamic(properties) and "cardinality" not in properties:
        return  # raw keys of any value: no cardinality to check (tf_dlrm.spec.dynamic)
    cardinality = properties.get("cardinality")
    if isinstance(cardinality, bool) or not isinstance(cardinality, int) or cardinality <= 0:
        _fail(spec, f"{where}.cardinality: categorical feature '{name}' needs a positive integer "
                    f"cardinality. Received: {cardinality!r}")
    if dtype not in INTEGER_DTYPES:
        _fail(spec, f"{where}.dtype: categorical feature '{name}' needs an integer dtype. Received: {dtype}")
    for key in ("hotness", "embedding_dim"):
        value = properties.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            _fail(spec, f"{where}.{key}: expected a positive integer. Received: {value!r}")
    for key in ("ragged", "weighted"):
        if not isinstance(properties.get(key, False), bool):
            _fail(spec, f"{where}.{key}: expected true or false. Received: {properties.get(key)!r}")
    if properties.get("combiner", "sum") not in COMBINERS:
        _fail(spec, f"{where}.combiner: expected one of {list(COMBINERS)}. Received: {properties.get('combiner')!r}")
    if cardinality - 1 > np.iinfo(np.dtype(dtype)).max:
        _fail(spec, f"{where}: cardinality {cardinality} does not fit dtype {dtype} "
                    f"(largest id {np.iinfo(np.dtype(dtype)).max})")


def _validate_sources(spec) -> None:
    if not isinstance(spec.source_spec, Mapping):
        _fail(spec, "source_spec: expected a mapping {split: [chunks]}")
    used = set(spec.channel_spec.get(LABEL_CHANNEL, [])) | set(spec.numerical_features) | set(spec.categorical_features)
    for split, chunks in spec.source_spec.items():
        if not isinstance(chunks, list) or not chunks:
            _fail(spec, f"source_spec.{split}: expected a non-empty list of chunks")
        types = set()
        covered: list[str] = []
        for index, chunk in enumerate(chunks):
            where = f"source_spec.{split}[{index}]"
            _validate_chunk(spec, where, chunk)
            types.add(chunk["type"])
            covered.extend(chunk["features"])
        if len(types) > 1:
            _fail(spec, f"source_spec.{split}: mixes chunk types {sorted(types)}; use one type per split")
        missing = sorted(used - set(covered))
        if missing:
            _fail(spec, f"source_spec.{split}: feature(s) {missing} used in channel_spec have no chunk")
        repeated = sorted({f for f in covered if covered.count(f) > 1})
        if repeated:
            _fail(spec, f"source_spec.{split}: feature(s) {repeated} appear in more than one chunk")


def _validate_chunk(spec, where: str, chunk) -> None:
    if not isinstance(chunk, Mapping):
        _fail(spec, f"{where}: expected a mapping with type, features, files")
    unknown = unknown_key_message(where, chunk, CHUNK_KEYS)
    if unknown:
        _fail(spec, unknown)
    if chunk.get("type") not in CHUNK_TYPES:
        _fail(spec, f"{where}.type: unknown chunk type {chunk.get('type')!r}. Allowed: {list(CHUNK_TYPES)}")
    features, files = chunk.get("features"), chunk.get("files")
    if not isinstance(features, list) or not features:
        _fail(spec, f"{where}.features: expected a non-empty list of feature names")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        _fail(spec, f"{where}.files: expected a non-empty list of relative file paths")
    for feature in features:
        if feature not in spec.feature_spec:
            _fail(spec, f"{where}.features: feature '{feature}' is not defined in feature_spec")
    if chunk["type"] == SPLIT_BINARY:
        _validate_split_binary_chunk(spec, where, chunk)
    if "lengths" in chunk:
        _validate_lengths_key(spec, where, chunk)
    if chunk["type"] == SPLIT_BINARY:
        _validate_weights_key(spec, where, chunk)
    else:
        _validate_weights_columns(spec, where, chunk)


def _validate_weights_columns(spec, where: str, chunk: Mapping[str, Any]) -> None:
    """A csv or parquet chunk names the column of each weighted feature's weights: ``weights: {feature: column}``,
    the column one of the chunk's, a float feature no channel reads."""
    weights = chunk.get("weights", {})
    if not isinstance(weights, Mapping):
        _fail(spec, f"{where}.weights: expected a mapping {{weighted feature: its weights column}}. Received: {weights!r}")
    used = set(spec.categorical_features) | set(spec.numerical_features) | set(spec.channel_spec.get(LABEL_CHANNEL, []))
    for feature in chunk["features"]:
        if feature in spec.categorical_features and spec.feature_spec[feature].get("weighted") is True and feature not in weights:
            _fail(spec, f"{where}.weights: feature '{feature}' says 'weighted: true': name the column of its weights "
                        f"(weights: {{{feature}: COLUMN}}, a float32 feature of the chunk that no channel reads)")
    for feature, column in weights.items():
        properties = spec.feature_spec.get(feature, {})
        if feature not in chunk["features"] or properties.get("weighted") is not True or properties.get("ragged") is not True:
            _fail(spec, f"{where}.weights: '{feature}' is not a weighted ragged feature of the chunk "
                        "('weighted: true' and 'ragged: true')")
        if column not in chunk["features"] or column in used or spec.feature_spec.get(column, {}).get("dtype") not in FLOAT_DTYPES:
            _fail(spec, f"{where}.weights.{feature}: column {column!r} must be a feature of the chunk with a float dtype "
                        "that no channel reads")


def _validate_weights_key(spec, where: str, chunk: Mapping[str, Any]) -> None:
    """A ``weights`` file belongs to the split_binary chunk (with a lengths file) of a ``weighted: true`` feature,
    and such a feature's chunk has one."""
    feature = chunk["features"][0]
    weighted = feature in spec.categorical_features and spec.feature_spec[feature].get("weighted") is True
    if "weights" not in chunk:
        if weighted:
            _fail(spec, f"{where}: feature '{feature}' says 'weighted: true': its chunk needs a weights file "
                        "(key 'weights', float32, one weight per id, beside its lengths file)")
        return
    if not isinstance(chunk["weights"], str) or not chunk["weights"]:
        _fail(spec, f"{where}.weights: expected the relative path of the feature's weights file. Received: {chunk['weights']!r}")
    if not weighted or not chunk.get("lengths"):
        _fail(spec, f"{where}.weights: feature '{feature}' has a weights file: it must be a categorical feature with "
                    "'weighted: true' and 'ragged: true', its chunk a lengths file")


def _validate_lengths_key(spec, where: str, chunk: Mapping[str, Any]) -> None:
    """A ``lengths`` file belongs to a split_binary chunk of one categorical feature that says ``ragged: true``."""
    if chunk["type"] != SPLIT_BINARY:
        _fail(spec, f"{where}.lengths: only a split_binary chunk has a lengths file. Received: type {chunk['type']!r}")
    if not isinstance(chunk["lengths"], str) or not chunk["lengths"]:
        _fail(spec, f"{where}.lengths: expected the relative path of the feature's lengths file. "
                    f"Received: {chunk['lengths']!r}")
    feature = chunk["features"][0]
    if feature not in spec.categorical_features:
        _fail(spec, f"{where}.lengths: only a categorical feature has row lengths. Received: feature '{feature}'")
    if spec.feature_spec[feature].get("ragged") is not True:
        _fail(spec, f"{where}.lengths: feature '{feature}' has a lengths file (rows of 0 to hotness ids); its "
                    f"entry must say 'ragged: true'")


def _validate_split_binary_chunk(spec, where: str, chunk: Mapping[str, Any]) -> None:
    features = chunk["features"]
    if len(chunk["files"]) != 1:
        _fail(spec, f"{where}.files: a split_binary chunk has exactly one file. Received: {chunk['files']}")
    if set(features) & set(spec.numerical_features):
        if features != spec.numerical_features:
            _fail(spec, f"{where}.features: the numerical chunk must list all numerical features in channel "
                        f"order {spec.numerical_features}. Received: {features}")
    elif len(features) != 1:
        _fail(spec, f"{where}.features: label and categorical split_binary chunks hold one feature each. Received: {features}")


# ------------------------------------------------------------------ data files


def check_files_exist(spec, split: str) -> None:
    """Every file of every chunk of ``split`` exists."""
    for index, chunk in enumerate(spec.chunks(split)):
        for relative in chunk["files"] + ([chunk["lengths"]] if chunk.get("lengths") else []):
            path = spec.resolve(relative)
            if not files.isfile(path):
                _fail(spec, f"source_spec.{split}[{index}]: data file not found: {path} (features {chunk['features']})")


_DTYPES_OF_SIZE = {1: "int8, uint8 or bool", 2: "int16 or float16", 4: "int32 or float32", 8: "int64 or float64"}


def _dtype_hint(spec, counts: dict, chunks: dict) -> str:
    """When a one-feature file holds the other files' sample count in values of another size, the
    spec's dtype is the likely mistake (e.g. int16 declared, int32 written): say so."""
    values = list(counts.values())
    reference = max(set(values), key=values.count)
    hints = []
    for path, count in counts.items():
        features = chunks[path]["features"]
        if count == reference or len(features) != 1 or chunks[path].get("lengths"):
            continue
        size, hotness = files.getsize(path), spec.hotness(features[0])
        width, remainder = divmod(size, reference * hotness) if reference else (0, 1)
        declared = spec.dtype(features[0])
        if not remainder and width in _DTYPES_OF_SIZE and width != declared.itemsize:
            hints.append(f"{files.basename(path)} holds exactly {reference} samples of {width}-byte values, and "
                         f"the spec declares {features[0]!r} as {declared.name} ({declared.itemsize} bytes): is it "
                         f"{_DTYPES_OF_SIZE[width]}?")
    return ("; " + " ".join(hints)) if hints else ""


def split_binary_problems(spec, split: str, prefix=None) -> tuple[list[str], int | None]:
    """Every missing or wrongly sized file of a split_binary split, and its sample count when all
    files hold the same whole number of records (else None). ``prefix(index)`` names chunk
    ``index`` (None: the whole split) in the messages; default ``source_spec.<split>[<index>]``."""
    prefix = prefix or (lambda index: f"source_spec.{split}" + ("" if index is None else f"[{index}]"))
    problems, counts, chunks = [], {}, {}
    for index, chunk in enumerate(spec.chunks(split)):
        path = spec.resolve(chunk["files"][0])
        if chunk.get("weights"):
            # Whole float32 weights; their count (the ids' count) is checked by the reader.
            weights = spec.resolve(chunk["weights"])
            if not files.isfile(weights):
                problems.append(f"{prefix(index)}: data file not found: {weights} (features {chunk['features']})")
            elif files.getsize(weights) % 4:
                problems.append(f"{prefix(index)}: file {weights} has {files.getsize(weights)} bytes, not a whole number "
                                f"of float32 weights (features {chunk['features']}); it may be truncated")
        if chunk.get("lengths"):
            # A variable-length feature: its ids file holds whole ids (their count is the sum of the
            # lengths, checked by the reader), its lengths file one length per sample.
            ids_dtype = spec.dtype(chunk["features"][0])
            if files.isfile(path) and files.getsize(path) % ids_dtype.itemsize:
                problems.append(f"{prefix(index)}: file {path} has {files.getsize(path)} bytes, not a whole number of "
                                f"{ids_dtype.itemsize}-byte ids (features {chunk['features']}); it may be truncated")
            elif not files.isfile(path):
                problems.append(f"{prefix(index)}: data file not found: {path} (features {chunk['features']})")
            path = spec.resolve(chunk["lengths"])
        if not files.isfile(path):
            problems.append(f"{prefix(index)}: data file not found: {path} (features {chunk['features']})")
            continue
        size, record = files.getsize(path), spec.record_bytes(chunk)
        if size % record:
            problems.append(f"{prefix(index)}: file {path} has {size} bytes, not a whole number of {record}-byte "
                            f"records (features {chunk['features']}); it may be truncated")
        counts[path], chunks[path] = size // record, chunk
    if len(set(counts.values())) > 1:
        # A file outside the spec's directory by its full path: its base name alone could pass for the
        # dataset's own file (a label file pointing at /etc/passwd read as 'passwd=3000').
        detail = ", ".join(f"{p} (outside the spec's directory)={n}" if spec.is_outside(chunks[p].get("lengths") or
                           chunks[p]["files"][0]) else f"{files.basename(p)}={n}" for p, n in counts.items())
        problems.append(f"{prefix(None)}: files hold different sample counts: {detail}"
                        + _dtype_hint(spec, counts, chunks))
    return problems, (next(iter(counts.values()), 0) if not problems else None)


def check_split_binary_files(spec, split: str) -> int:
    """The sample count of a split_binary split; raises at its first missing or wrongly sized file."""
    check_files_exist(spec, split)
    problems, count = split_binary_problems(spec, split)
    if problems:
        _fail(spec, problems[0])
    return count
