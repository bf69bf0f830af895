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
  crossed features of Wide & Deep's wide part (format: :mod:`tf_dlrm.spec.crossed_features`).

split_binary layout (one file per chunk, no header, row-major): ``label.bin`` holds the label as one
byte per sample; ``numerical.bin`` all numerical features of a sample side by side in one dtype;
one ``cat_<i>.bin`` per categorical feature, in the smallest integer type that holds its ids, with
``hotness`` ids per sample side by side (a fixed count; there is no pad id).

Loading never executes code (``yaml.safe_load``); every validation error
(:mod:`tf_dlrm.spec.validation`) is a :class:`FeatureSpecError` whose message names the spec
file, the key, the feature and the data file. The format's names (channels, chunk types, splits,
dtypes) live in :mod:`tf_dlrm.spec.format` and are importable from here too.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

from tf_dlrm.io import files
from tf_dlrm.spec.format import (
    CATEGORICAL_CHANNEL,
    LABEL_CHANNEL,
    NUMERICAL_CHANNEL,
    SPLIT_BINARY,
    FeatureSpecError,
    lengths_dtype_for,
)
from tf_dlrm.spec.validation import (
    check_files_exist,
    check_split_binary_files,
    split_binary_problems,
    unknown_key_message,
    validate_structure,
)


def read_spec_yaml(path: str):
    """The parsed yaml of a spec file; a missing file or bad YAML is a :class:`FeatureSpecError` naming it."""
    try:
        with files.open_file(path, "r", encoding="utf-8") as handle:
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
    # Per categorical feature, the lengths file of a variable-length one (chunk key `lengths`), else None.
    lengths: tuple = ()
    # Per categorical feature, the weights file of a weighted one (chunk key `weights`), else None.
    weights: tuple = ()

    def lengths_of(self, index: int) -> str | None:
        return self.lengths[index] if self.lengths else None

    def weights_of(self, index: int) -> str | None:
        return self.weights[index] if self.weights else None


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
            raw, base_directory=files.dirname(files.absolute(path)), source=path, check_files=check_files
        )

    @classmethod
    def from_dict(
        cls, raw: Any, base_directory: str = ".", source: str = "<feature spec>", check_files: bool = False
    ) -> "FeatureSpec":
        if not isinstance(raw, Mapping):
            raise FeatureSpecError(f"{source}: expected a mapping at the top level. Received: {type(raw).__name__}")
        allowed = ("feature_spec", "channel_spec", "source_spec", "metadata", "crossed_features")
        unknown = unknown_key_message("top level", raw, allowed)
        if unknown:
            raise FeatureSpecError(f"{source}: {unknown}")
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
        """The parsed ``crossed_features`` (:class:`tf_dlrm.spec.crossed_features.CrossedFeature`)."""
        from tf_dlrm.spec.crossed_features import parse_crossed_features

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
        # A dynamic table (tf_dlrm.spec.dynamic) may omit its cardinality: its rows are its capacity.
        return [int(self.feature_spec[name].get("cardinality") or self.feature_spec[name]["capacity"])
                for name in self.categorical_features]

    def hotness(self, feature: str) -> int:
        """Ids per sample of a categorical feature (1: one-hot)."""
        return int(self.feature_spec[feature].get("hotness", 1))

    def ragged(self, feature: str) -> bool:
        """Whether a sample of a categorical feature holds any number of ids from 0 to its hotness
        (``ragged: true``; NVIDIA's split_tfrecords multi-hot features are, see
        :func:`tf_dlrm.data.split_tfrecords.ragged_by_default`), not exactly ``hotness``."""
        return self.feature_spec[feature].get("ragged", False) is True

    def combiner(self, feature: str) -> str:
        return str(self.feature_spec[feature].get("combiner", "sum"))

    def weighted(self, feature: str) -> bool:
        """Whether a categorical feature has a weight per id (``weighted: true``, a ``weights`` file)."""
        return self.feature_spec[feature].get("weighted", False) is True

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
        return files.normalize(files.join(self.base_directory, relative_path))

    def is_outside(self, relative_path: str) -> bool:
        """Whether a file path of the spec leads out of the spec's directory (absolute, or ``..`` past it)."""
        base = files.normalize(files.absolute(self.base_directory))
        path = files.normalize(files.absolute(self.resolve(relative_path)))
        return not (path + "/").startswith(base.rstrip("/") + "/")

    def files_outside(self) -> list[str]:
        """``"'label' (split 'train'): ../x/label.bin -> /abs/x/label.bin"`` for every data file the spec names
        outside its directory. NVIDIA's format allows them (a path is only relative to the yaml, or absolute),
        and a spec may share files with another dataset; a run names them, since a spec from elsewhere could
        otherwise read any file without a word."""
        found = []
        for split in self.splits:
            for chunk in self.chunks(split):
                extra = [chunk[key] for key in ("lengths", "weights") if chunk.get(key)]
                for relative in list(chunk.get("files", [])) + extra:
                    if self.is_outside(relative):
                        names = ", ".join(repr(f) for f in chunk.get("features", []))
                        found.append(f"{names} (split '{split}'): {relative} -> {self.resolve(relative)}")
        return found

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
        by_feature, lengths, weights = {}, {}, {}
        for chunk in self.chunks(split):
            for feature in chunk["features"]:
                by_feature[feature] = self.resolve(chunk["files"][0])
                if chunk.get("lengths"):
                    lengths[feature] = self.resolve(chunk["lengths"])
                if chunk.get("weights"):
                    weights[feature] = self.resolve(chunk["weights"])
        counts = check_split_binary_files(self, split)
        numerical = by_feature[self.numerical_features[0]] if self.numerical_features else None
        return SplitFiles(
            split=split,
            label=by_feature[self.label_feature],
            numerical=numerical,
            categorical=tuple(by_feature[name] for name in self.categorical_features),
            num_samples=counts,
            lengths=tuple(lengths.get(name) for name in self.categorical_features),
            weights=tuple(weights.get(name) for name in self.categorical_features),
        )

    # ------------------------------------------------------------------ validation

    def validate(self, check_files: bool = True) -> None:
        """Checks structure, dtypes and cardinalities; with ``check_files`` also data file sizes
        (:mod:`tf_dlrm.spec.validation`).

        Raises:
            FeatureSpecError: naming the spec file, key, feature and data file at fault.
        """
        validate_structure(self)
        try:
            self.crossed_features
        except ValueError as error:
            raise FeatureSpecError(str(error)) from None
        if check_files:
            for split in self.source_spec:
                if self.chunk_type(split) == SPLIT_BINARY:
                    check_split_binary_files(self, split)
                else:
                    check_files_exist(self, split)

    def record_bytes(self, chunk: Mapping[str, Any]) -> int:
        """Bytes one sample occupies in a split_binary chunk's file (``hotness`` ids of a categorical);
        for a variable-length feature (chunk key ``lengths``), in its lengths file (one length)."""
        if chunk.get("lengths"):
            return lengths_dtype_for(self.hotness(chunk["features"][0])).itemsize
        return sum(self.dtype(feature).itemsize * self.hotness(feature) for feature in chunk["features"])

    def split_binary_problems(self, split: str, prefix=None) -> tuple[list[str], int | None]:
        """Every missing or wrongly sized file of a split_binary split, and its sample count when all
        files agree (else None): :func:`tf_dlrm.spec.validation.split_binary_problems`."""
        return split_binary_problems(self, split, prefix)
