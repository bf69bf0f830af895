"""FeatureSpec: the yaml that describes a dataset, in NVIDIA DeepLearningExamples' TF2 DLRM format.

A spec has four top-level keys:

- ``feature_spec``: ``{name: {dtype: ..., cardinality: ...}}`` (cardinality for categoricals only);
  a categorical may add ``hotness`` (ids per sample, default 1), ``combiner`` (``sum``, ``mean``,
  ``sqrtn``: how a sample's vectors are pooled, default ``sum``) and ``embedding_dim`` (its table's
  width, default the ``--embedding_dim`` flag);
- ``channel_spec``: ``{label: [name], numerical: [names...], categorical: [names...]}``;
- ``source_spec``: ``{split: [chunk, ...]}``, each chunk ``{type: split_binary|csv, features: [...],
  files: [...]}`` with file paths relative to the yaml's directory;
- ``metadata``: free-form dataset facts (e.g. ``oracle_valid_auc`` of a synthetic dataset);
- optional ``crossed_features``: pairs of one-hot categoricals hashed into a bucket count, the
  crossed features of Wide & Deep's wide part (format: :mod:`tf_dlrm.config.crossed_features`).

split_binary layout (one file per chunk, no header, row-major): ``label.bin`` holds the label as one
byte per sample; ``numerical.bin`` all numerical features of a sample side by side in one dtype;
one ``cat_<i>.bin`` per categorical feature, in the smallest integer type that holds its ids, with
``hotness`` ids per sample side by side (a fixed count; there is no pad id).

Loading never executes code (``yaml.safe_load``); every validation error is a
:class:`FeatureSpecError` whose message names the spec file, the key, the feature and the data file.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

from tf_dlrm.dynamic import spec as dynamic_spec

LABEL_CHANNEL = "label"
NUMERICAL_CHANNEL = "numerical"
CATEGORICAL_CHANNEL = "categorical"
CHANNELS = (LABEL_CHANNEL, NUMERICAL_CHANNEL, CATEGORICAL_CHANNEL)

SPLIT_BINARY = "split_binary"
CSV = "csv"
CHUNK_TYPES = (SPLIT_BINARY, CSV)
# Optional chunk keys; `header`, `delimiter` and `encode` (raw categorical values -> keys, see
# tf_dlrm.data.transcode) only mean something for csv chunks.
CHUNK_KEYS = ("type", "features", "files", "header", "delimiter", "encode", "transform")

COMBINERS = ("sum", "mean", "sqrtn")
SUPPORTED_DTYPES = ("bool", "float16", "float32", "int8", "int16", "int32", "int64")
INTEGER_DTYPES = ("int8", "int16", "int32", "int64")
FLOAT_DTYPES = ("float16", "float32")

TRAIN_SPLIT = "train"
TEST_SPLIT = "test"


class FeatureSpecError(ValueError):
    """A feature spec, or the data files it names, is not valid."""


def categorical_dtype_for(cardinality: int) -> np.dtype:
    """The smallest signed integer type NVIDIA's DLRM uses for ids of this cardinality.

    Their rule is ``cardinality < iinfo(t).max`` over int8, int16, int32; we extend it with int64 so
    that tables beyond 2**31 rows are representable.
    """
    for candidate in (np.int8, np.int16, np.int32):
        if cardinality < np.iinfo(candidate).max:
            return np.dtype(candidate)
    return np.dtype(np.int64)


def read_spec_yaml(path: str):
    """The parsed yaml of a spec file; a missing file or bad YAML is a :class:`FeatureSpecError` naming it."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except FileNotFoundError as error:
        raise FeatureSpecError(f"Feature spec file not found: {path}") from error
    except yaml.YAMLError as error:
        raise FeatureSpecError(f"{path}: not valid YAML: {error}") from error


@dataclasses.dataclass(frozen=True)
class SplitFiles:
    """Absolute paths of one split's split_binary files and its sample count."""

    split: str
    label: str
    numerical: str | None
    categorical: tuple[str, ...]  # one per categorical feature, channel order
    num_samples: int


class FeatureSpec:
    """An in-memory FeatureSpec bound to the directory its relative file paths start from."""

    def __init__(
        self,
        feature_spec: Mapping[str, Mapping[str, Any]],
        channel_spec: Mapping[str, Sequence[str]],
        source_spec: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        metadata: Mapping[str, Any] | None = None,
        base_directory: str = ".",
        source: str = "<feature spec>",
        crossed_features: Sequence[Mapping[str, Any]] | None = None,
    ):
        self.feature_spec = copy.deepcopy(dict(feature_spec))
        self.channel_spec = {k: list(v) for k, v in channel_spec.items()}
        self.source_spec = copy.deepcopy(dict(source_spec or {}))
        self.metadata = copy.deepcopy(dict(metadata or {}))
        self.crossed_features_entries = copy.deepcopy(crossed_features) if crossed_features is not None else []
        self.base_directory = base_directory
        self.source = source

    # ------------------------------------------------------------------ loading and saving

    @classmethod
    def load(cls, path: str, check_files: bool = True) -> "FeatureSpec":
        """Reads and validates a yaml spec; with ``check_files`` also its split_binary files."""
        raw = read_spec_yaml(path)
        return cls.from_dict(
            raw, base_directory=os.path.dirname(os.path.abspath(path)), source=path, check_files=check_files
        )

    @classmethod
    def from_dict(
        cls, raw: Any, base_directory: str = ".", source: str = "<feature spec>", check_files: bool = False
    ) -> "FeatureSpec":
        if not isinstance(raw, Mapping):
            raise FeatureSpecError(f"{source}: expected a mapping at the top level. Received: {type(raw).__name__}")
        allowed = {"feature_spec", "channel_spec", "source_spec", "metadata", "crossed_features"}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise FeatureSpecError(
                f"{source}: unknown top-level key(s) {unknown}. Allowed: {sorted(allowed)}"
            )
        for key in ("feature_spec", "channel_spec"):
            if not isinstance(raw.get(key), Mapping):
                raise FeatureSpecError(f"{source}: key '{key}' is missing or is not a mapping")
        spec = cls(
            feature_spec=raw["feature_spec"],
            channel_spec=raw["channel_spec"],
            source_spec=raw.get("source_spec") or {},
            metadata=raw.get("metadata") or {},
            base_directory=base_directory,
            source=source,
            crossed_features=raw.get("crossed_features"),
        )
        spec.validate(check_files=check_files)
        return spec

    def to_dict(self) -> dict[str, Any]:
        return {
            "feature_spec": copy.deepcopy(self.feature_spec),
            "channel_spec": copy.deepcopy(self.channel_spec),
            "source_spec": copy.deepcopy(self.source_spec),
            "metadata": copy.deepcopy(self.metadata),
            # Written only when present, so NVIDIA-format specs round-trip unchanged.
            **({"crossed_features": copy.deepcopy(self.crossed_features_entries)} if self.crossed_features_entries else {}),
        }

    def save(self, path: str) -> None:
        """Writes the spec as yaml, atomically: a reader sees the old file or the new one, never half."""
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".feature_spec.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                yaml.safe_dump(self.to_dict(), stream, sort_keys=False, default_flow_style=False)
            # mkstemp makes the file private (0600); give it the mode a plain open() would have.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    # ------------------------------------------------------------------ accessors

    @property
    def label_feature(self) -> str:
        return self.channel_spec[LABEL_CHANNEL][0]

    @property
    def crossed_features(self) -> tuple:
        """The parsed ``crossed_features`` (:class:`tf_dlrm.config.crossed_features.CrossedFeature`)."""
        from tf_dlrm.config.crossed_features import parse_crossed_features

        categorical = self.categorical_features
        return parse_crossed_features(self.crossed_features_entries, categorical,
                                      {name: self.hotness(name) for name in categorical}, self.source)

    @property
    def numerical_features(self) -> list[str]:
        return list(self.channel_spec.get(NUMERICAL_CHANNEL, []))

    @property
    def categorical_features(self) -> list[str]:
        return list(self.channel_spec.get(CATEGORICAL_CHANNEL, []))

    @property
    def splits(self) -> list[str]:
        return list(self.source_spec)

    def cardinalities(self) -> list[int]:
        # A dynamic table (tf_dlrm.dynamic.spec) may omit its cardinality: its rows are its capacity.
        return [int(self.feature_spec[name].get("cardinality") or self.feature_spec[name]["capacity"])
                for name in self.categorical_features]

    def hotness(self, feature: str) -> int:
        """Ids per sample of a categorical feature (1: one-hot)."""
        return int(self.feature_spec[feature].get("hotness", 1))

    def combiner(self, feature: str) -> str:
        return str(self.feature_spec[feature].get("combiner", "sum"))

    def embedding_dims(self, default: int) -> list[int]:
        """The table width of every categorical feature: its ``embedding_dim`` or ``default``."""
        return [int(self.feature_spec[name].get("embedding_dim", default)) for name in self.categorical_features]

    def dtype(self, feature: str) -> np.dtype:
        return np.dtype(self.feature_spec[feature]["dtype"])

    def numerical_dtype(self) -> np.dtype:
        names = self.numerical_features
        return self.dtype(names[0]) if names else np.dtype(np.float16)

    def chunks(self, split: str) -> list[dict[str, Any]]:
        if split not in self.source_spec:
            raise FeatureSpecError(
                f"{self.source}: source_spec has no split '{split}'. Available: {self.splits}"
            )
        return self.source_spec[split]

    def resolve(self, relative_path: str) -> str:
        return os.path.normpath(os.path.join(self.base_directory, relative_path))

    def chunk_type(self, split: str) -> str:
        """The chunk type of a split; a split mixes no types."""
        return self.chunks(split)[0]["type"]

    def split_files(self, split: str) -> SplitFiles:
        """Paths and sample count of a split_binary split (files must exist)."""
        if self.chunk_type(split) != SPLIT_BINARY:
            raise FeatureSpecError(
                f"{self.source}: split '{split}' has chunks of type '{self.chunk_type(split)}'; "
                f"training reads only '{SPLIT_BINARY}'. Convert it with `python -m tf_dlrm.data.transcode`."
            )
        by_feature = {}
        for chunk in self.chunks(split):
            for feature in chunk["features"]:
                by_feature[feature] = self.resolve(chunk["files"][0])
        counts = self._check_split_binary_files(split)
        numerical = by_feature[self.numerical_features[0]] if self.numerical_features else None
        return SplitFiles(
            split=split,
            label=by_feature[self.label_feature],
            numerical=numerical,
            categorical=tuple(by_feature[name] for name in self.categorical_features),
            num_samples=counts,
        )

    # ------------------------------------------------------------------ validation

    def validate(self, check_files: bool = True) -> None:
        """Checks structure, dtypes and cardinalities; with ``check_files`` also data file sizes.

        Raises:
            FeatureSpecError: naming the spec file, key, feature and data file at fault.
        """
        self._validate_channels()
        self._validate_features()
        self._validate_sources()
        try:
            self.crossed_features
        except ValueError as error:
            raise FeatureSpecError(str(error)) from None
        if check_files:
            for split in self.source_spec:
                if self.chunk_type(split) == SPLIT_BINARY:
                    self._check_split_binary_files(split)
                else:
                    self._check_files_exist(split)

    def _fail(self, message: str) -> None:
        raise FeatureSpecError(f"{self.source}: {message}")

    def _validate_channels(self) -> None:
        for channel, names in self.channel_spec.items():
            if channel not in CHANNELS:
                self._fail(f"channel_spec: unknown channel '{channel}'. Allowed channels: {list(CHANNELS)}")
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                self._fail(f"channel_spec.{channel}: expected a list of feature names. Received: {names!r}")
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                self._fail(f"channel_spec.{channel}: feature(s) {duplicates} listed more than once")
        labels = self.channel_spec.get(LABEL_CHANNEL)
        if not labels or len(labels) != 1:
            self._fail(f"channel_spec.{LABEL_CHANNEL}: expected exactly one label feature. Received: {labels!r}")
        seen: dict[str, str] = {}
        for channel, names in self.channel_spec.items():
            for name in names:
                if name not in self.feature_spec:
                    self._fail(
                        f"channel_spec.{channel}: feature '{name}' is not defined in feature_spec "
                        f"(defined: {sorted(self.feature_spec)[:10]}{'...' if len(self.feature_spec) > 10 else ''})"
                    )
                if name in seen:
                    self._fail(f"feature '{name}' is in both channel '{seen[name]}' and channel '{channel}'")
                seen[name] = channel
        if not self.categorical_features and not self.numerical_features:
            self._fail("channel_spec: needs at least one numerical or categorical feature")

    def _validate_features(self) -> None:
        categorical = set(self.categorical_features)
        for name, properties in self.feature_spec.items():
            where = f"feature_spec.{name}"
            if not isinstance(properties, Mapping):
                self._fail(f"{where}: expected a mapping with 'dtype'. Received: {properties!r}")
            dtype = properties.get("dtype")
            if dtype not in SUPPORTED_DTYPES:
                self._fail(f"{where}.dtype: unsupported dtype {dtype!r}. Supported: {list(SUPPORTED_DTYPES)}")
            if name in categorical:
                dynamic_problem = dynamic_spec.problem(name, properties)
                if dynamic_problem:
                    self._fail(f"{where}{dynamic_problem}")
                if dynamic_spec.is_dynamic(properties) and "cardinality" not in properties:
                    continue  # raw keys of any value: no cardinality to check (tf_dlrm.dynamic.spec)
                cardinality = properties.get("cardinality")
                if isinstance(cardinality, bool) or not isinstance(cardinality, int) or cardinality <= 0:
                    self._fail(
                        f"{where}.cardinality: categorical feature '{name}' needs a positive integer "
                        f"cardinality. Received: {cardinality!r}"
                    )
                if dtype not in INTEGER_DTYPES:
                    self._fail(f"{where}.dtype: categorical feature '{name}' needs an integer dtype. Received: {dtype}")
                for key in ("hotness", "embedding_dim"):
                    value = properties.get(key, 1)
                    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                        self._fail(f"{where}.{key}: expected a positive integer. Received: {value!r}")
                if properties.get("combiner", "sum") not in COMBINERS:
                    self._fail(f"{where}.combiner: expected one of {list(COMBINERS)}. Received: {properties.get('combiner')!r}")
                if cardinality - 1 > np.iinfo(np.dtype(dtype)).max:
                    self._fail(
                        f"{where}: cardinality {cardinality} does not fit dtype {dtype} "
                        f"(largest id {np.iinfo(np.dtype(dtype)).max})"
                    )
        numerical_dtypes = {self.feature_spec[n]["dtype"] for n in self.numerical_features}
        if numerical_dtypes - set(FLOAT_DTYPES):
            self._fail(f"numerical features need dtype float16 or float32. Received: {sorted(numerical_dtypes)}")
        if len(numerical_dtypes) > 1:
            self._fail(f"numerical features must share one dtype (they share one file). Received: {sorted(numerical_dtypes)}")

    def _validate_sources(self) -> None:
        if not isinstance(self.source_spec, Mapping):
            self._fail("source_spec: expected a mapping {split: [chunks]}")
        used = set(self.channel_spec.get(LABEL_CHANNEL, [])) | set(self.numerical_features) | set(self.categorical_features)
        for split, chunks in self.source_spec.items():
            if not isinstance(chunks, list) or not chunks:
                self._fail(f"source_spec.{split}: expected a non-empty list of chunks")
            types = set()
            covered: list[str] = []
            for index, chunk in enumerate(chunks):
                where = f"source_spec.{split}[{index}]"
                if not isinstance(chunk, Mapping):
                    self._fail(f"{where}: expected a mapping with type, features, files")
                unknown = sorted(set(chunk) - set(CHUNK_KEYS))
                if unknown:
                    self._fail(f"{where}: unknown key(s) {unknown}. Allowed: {list(CHUNK_KEYS)}")
                if chunk.get("type") not in CHUNK_TYPES:
                    self._fail(f"{where}.type: unknown chunk type {chunk.get('type')!r}. Allowed: {list(CHUNK_TYPES)}")
                types.add(chunk["type"])
                features, files = chunk.get("features"), chunk.get("files")
                if not isinstance(features, list) or not features:
                    self._fail(f"{where}.features: expected a non-empty list of feature names")
                if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
                    self._fail(f"{where}.files: expected a non-empty list of relative file paths")
                for feature in features:
                    if feature not in self.feature_spec:
                        self._fail(f"{where}.features: feature '{feature}' is not defined in feature_spec")
                covered.extend(features)
                if chunk["type"] == SPLIT_BINARY:
                    self._validate_split_binary_chunk(where, chunk)
            if len(types) > 1:
                self._fail(f"source_spec.{split}: mixes chunk types {sorted(types)}; use one type per split")
            missing = sorted(used - set(covered))
            if missing:
                self._fail(f"source_spec.{split}: feature(s) {missing} used in channel_spec have no chunk")
            repeated = sorted({f for f in covered if covered.count(f) > 1})
            if repeated:
                self._fail(f"source_spec.{split}: feature(s) {repeated} appear in more than one chunk")

    def _validate_split_binary_chunk(self, where: str, chunk: Mapping[str, Any]) -> None:
        features = chunk["features"]
        if len(chunk["files"]) != 1:
            self._fail(f"{where}.files: a split_binary chunk has exactly one file. Received: {chunk['files']}")
        if set(features) & set(self.numerical_features):
            if features != self.numerical_features:
                self._fail(
                    f"{where}.features: the numerical chunk must list all numerical features in channel "
                    f"order {self.numerical_features}. Received: {features}"
                )
        elif len(features) != 1:
            self._fail(f"{where}.features: label and categorical split_binary chunks hold one feature each. Received: {features}")

    def record_bytes(self, chunk: Mapping[str, Any]) -> int:
        """Bytes one sample occupies in a split_binary chunk's file (``hotness`` ids of a categorical)."""
        return sum(self.dtype(feature).itemsize * self.hotness(feature) for feature in chunk["features"])

    def _check_files_exist(self, split: str) -> None:
        for index, chunk in enumerate(self.chunks(split)):
            for relative in chunk["files"]:
                path = self.resolve(relative)
                if not os.path.isfile(path):
                    self._fail(f"source_spec.{split}[{index}]: data file not found: {path} (features {chunk['features']})")

    def split_binary_problems(self, split: str, prefix=None) -> tuple[list[str], int | None]:
        """Every missing or wrongly sized file of a split_binary split, and its sample count when all
        files hold the same whole number of records (else None). ``prefix(index)`` names chunk
        ``index`` (None: the whole split) in the messages; default ``source_spec.<split>[<index>]``."""
        prefix = prefix or (lambda index: f"source_spec.{split}" + ("" if index is None else f"[{index}]"))
        problems, counts = [], {}
        for index, chunk in enumerate(self.chunks(split)):
            path = self.resolve(chunk["files"][0])
            if not os.path.isfile(path):
                problems.append(f"{prefix(index)}: data file not found: {path} (features {chunk['features']})")
                continue
            size, record = os.path.getsize(path), self.record_bytes(chunk)
            if size % record:
                problems.append(f"{prefix(index)}: file {path} has {size} bytes, not a whole number of {record}-byte "
                                f"records (features {chunk['features']}); it may be truncated")
            counts[path] = size // record
        if len(set(counts.values())) > 1:
            detail = ", ".join(f"{os.path.basename(p)}={n}" for p, n in counts.items())
            problems.append(f"{prefix(None)}: files hold different sample counts: {detail}")
        return problems, (next(iter(counts.values()), 0) if not problems else None)

    def _check_split_binary_files(self, split: str) -> int:
        self._check_files_exist(split)
        problems, count = self.split_binary_problems(split)
        if problems:
            self._fail(problems[0])
        return count
