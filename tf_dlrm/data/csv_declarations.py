"""The per-column declarations of a csv chunk: ``encode`` (categoricals) and ``transform`` (numericals).

::

    encode:
      city: vocabulary                                  # ids by frequency, min_count 1, OOV id 0
      url: {type: vocabulary, min_count: 3, oov: last}  # values seen < 3 times in train -> OOV id V
      item: hash                                        # int64 key of a dynamic table (dtype int64, dynamic: true)
    transform:
      price: log1p
      age: {clip: [0, 120]}
      clicks: [{clip: [0, null]}, log1p]                # steps in order

Every split's chunk must declare the same encodings and transforms (the vocabulary comes from the
train split and is applied to all of them). A feature encoded by vocabulary gets its cardinality from
the vocabulary: the input spec gives none (its dtype may be omitted too).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping

from tf_dlrm.data.csv_values import LOG1P, Clip, TranscodeError
from tf_dlrm.data.csv_vocabulary import OOV_POSITIONS, VocabularyOptions

ENCODINGS = ("hash", "vocabulary")
HASH, VOCABULARY = ENCODINGS
VOCABULARY_KEYS = ("type", "min_count", "oov")


@dataclasses.dataclass(frozen=True)
class Declarations:
    """A split's checked declarations: feature -> "hash" or VocabularyOptions; feature -> transform steps."""

    encode: Mapping[str, Any]
    transform: Mapping[str, tuple]

    def vocabulary_features(self) -> dict[str, VocabularyOptions]:
        return {f: e for f, e in self.encode.items() if isinstance(e, VocabularyOptions)}


def vocabulary_features_of_raw(raw: Any) -> set[str]:
    """Features some csv chunk of a raw (unvalidated) spec dict encodes by vocabulary."""
    found = set()
    if isinstance(raw, Mapping) and isinstance(raw.get("source_spec"), Mapping):
        for chunks in raw["source_spec"].values():
            for chunk in chunks if isinstance(chunks, list) else []:
                encode = chunk.get("encode") if isinstance(chunk, Mapping) else None
                for feature, encoding in (encode.items() if isinstance(encode, Mapping) else []):
                    if encoding == VOCABULARY or (isinstance(encoding, Mapping) and encoding.get("type") == VOCABULARY):
                        found.add(feature)
    return found


def read_declarations(spec, split: str, chunk: Mapping[str, Any]) -> Declarations:
    where = f"{spec.source}: source_spec.{split}[0]"
    return Declarations(_read_encode(spec, f"{where}.encode", chunk.get("encode", {})),
                        _read_transform(spec, f"{where}.transform", chunk.get("transform", {})))


def _read_encode(spec, where: str, encode: Any) -> dict:
    if not isinstance(encode, Mapping):
        raise TranscodeError(f"{where}: expected a mapping feature -> encoding. Received: {encode!r}")
    checked = {}
    for feature, encoding in encode.items():
        if feature not in spec.categorical_features:
            raise TranscodeError(f"{where}.{feature}: only categorical features are encoded. Received: {feature!r}")
        kind = encoding.get("type") if isinstance(encoding, Mapping) else encoding
        if kind not in ENCODINGS:
            raise TranscodeError(f"{where}.{feature}: expected one of {list(ENCODINGS)} (or a mapping with type: "
                                 f"vocabulary). Received: {encoding!r}")
        properties = spec.feature_spec[feature]
        if spec.hotness(feature) != 1:
            raise TranscodeError(f"{where}.{feature}: encoding multi-hot cells is not supported (hotness "
                                 f"{spec.hotness(feature)}); give their ids as numbers")
        if kind == HASH:
            if encoding != HASH:
                raise TranscodeError(f"{where}.{feature}: hash takes no options; write {feature}: hash. Received: {encoding!r}")
            if properties.get("dynamic") is not True or properties.get("dtype") != "int64":
                raise TranscodeError(f"{where}.{feature}: a hashed feature holds raw int64 keys of a one-hot dynamic table; "
                                     f"declare it with dtype: int64 and dynamic: true (and a capacity). Received: {dict(properties)}")
            checked[feature] = HASH
            continue
        if properties.get("dynamic") is True:
            raise TranscodeError(f"{where}.{feature}: vocabulary ids are for a fixed table; a dynamic table takes "
                                 f"encode: hash (or drop dynamic: true)")
        checked[feature] = _vocabulary_options(f"{where}.{feature}", encoding if isinstance(encoding, Mapping) else {})
    return checked


def _vocabulary_options(where: str, options: Mapping[str, Any]) -> VocabularyOptions:
    unknown = sorted(set(options) - set(VOCABULARY_KEYS))
    if unknown:
        raise TranscodeError(f"{where}: unknown option(s) {unknown}. Allowed: {list(VOCABULARY_KEYS)}")
    min_count = options.get("min_count", 1)
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise TranscodeError(f"{where}.min_count: expected a positive integer. Received: {min_count!r}")
    oov = options.get("oov", OOV_POSITIONS[0])
    if oov not in OOV_POSITIONS:
        raise TranscodeError(f"{where}.oov: expected one of {list(OOV_POSITIONS)} (the out-of-vocabulary id is 0 or "
                             f"the last id). Received: {oov!r}")
    return VocabularyOptions(min_count=min_count, oov=oov)


def _read_transform(spec, where: str, transform: Any) -> dict:
    if not isinstance(transform, Mapping):
        raise TranscodeError(f"{where}: expected a mapping feature -> transform. Received: {transform!r}")
    checked = {}
    for feature, steps in transform.items():
        if feature not in spec.numerical_features:
            raise TranscodeError(f"{where}.{feature}: only numerical features are transformed. Received: {feature!r}")
        steps = steps if isinstance(steps, list) else [steps]
        checked[feature] = tuple(_transform_step(f"{where}.{feature}", step) for step in steps)
        if not checked[feature]:
            raise TranscodeError(f"{where}.{feature}: expected log1p, {{clip: [lo, hi]}} or a list of them. Received: []")
    return checked


def _transform_step(where: str, step: Any):
    if step == LOG1P:
        return LOG1P
    if isinstance(step, Mapping) and set(step) == {"clip"}:
        bounds = step["clip"]
        valid = isinstance(bounds, list) and len(bounds) == 2 and all(
            b is None or (isinstance(b, numbers.Real) and not isinstance(b, bool) and abs(b) != float("inf") and b == b)
            for b in bounds)
        if not valid:
            raise TranscodeError(f"{where}.clip: expected [lo, hi], finite numbers or null (open). Received: {bounds!r}")
        low, high = (None if b is None else float(b) for b in bounds)
        if low is not None and high is not None and low > high:
            raise TranscodeError(f"{where}.clip: lo must not exceed hi. Received: {bounds!r}")
        return Clip(low, high)
    raise TranscodeError(f"{where}: unknown transform; expected log1p or {{clip: [lo, hi]}}. Received: {step!r}")


def transform_entry(steps: tuple) -> list:
    """The steps as written back into the output spec (readable, re-readable by :func:`_read_transform`)."""
    return [step if step == LOG1P else {"clip": [step.low, step.high]} for step in steps]
