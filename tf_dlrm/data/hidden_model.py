"""The hidden model behind :mod:`tf_dlrm.data.synthetic`: id popularity, per-id effects, labels.

Categorical ids follow a power law through a random permutation per table; the logit is a bias,
a linear part over standardised numerical features, one scalar per id and dot products of 4-d
hidden vectors (see the generator's module docstring for the formula and the calibration). Kept
apart from the writer so that what the labels are and how files are written can be read alone.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from tf_dlrm.spec.feature_spec import FeatureSpec

HIDDEN_DIM = 4
MAX_PAIRS = 8
# Ranks past this get no effect of their own (the decay has made it negligible): bounds memory
# for tables of tens of millions of rows.
MAX_EFFECT_RANKS = 1 << 16
# Tables up to this size get an explicit random permutation; larger ones an affine one (no memory).
MAX_EXPLICIT_PERMUTATION = 1 << 22
_CALIBRATION_SAMPLES = 1 << 16


@dataclasses.dataclass(frozen=True)
class GeneratorConfig:
    """Shape of the hidden model and of the sample distribution.

    Attributes:
        zipf_exponent: power-law exponent ``s`` of id popularity, ``p(rank) ~ (rank + 1) ** -s``.
        logit_std: spread of the hidden logit (bias aside); sets the oracle AUC (~0.8 at 1.6).
        positive_rate: mean click probability the bias is solved for.
        effect_head, effect_decay: per-id effects scale as ``(1 + rank / head) ** -decay``.
        numerical_share, pairwise_share: fractions of the logit variance from the numerical part
            and the pairwise dot products; the per-id scalar effects take the rest.
    """

    zipf_exponent: float = 1.3
    logit_std: float = 1.6
    positive_rate: float = 0.25
    effect_head: float = 2.0
    effect_decay: float = 1.5
    numerical_share: float = 0.35
    pairwise_share: float = 0.15
    # Write sparse int64 keys for dynamic tables instead of ids (tf_dlrm.embedding.dynamic): see _as_keys.
    hashed_keys: bool = False
    # Per categorical feature, in spec order: a Zipf exponent (> 0), or 0 for uniform ids; empty means
    # zipf_exponent for every feature. Reproduces the different skews of real logs' features.
    feature_zipf_exponents: tuple = ()
    # Multi-hot rows of 1 to ``hotness`` ids (DLE's ``variable_hotness``): see :func:`power_law_lengths`.
    variable_hotness: bool = False

    def exponent_of(self, feature: int) -> float:
        """Zipf exponent of categorical feature `feature` (0 means uniform)."""
        return self.feature_zipf_exponents[feature] if self.feature_zipf_exponents else self.zipf_exponent

    def __post_init__(self):
        if self.zipf_exponent <= 0:
            raise ValueError(f"Expected zipf_exponent > 0. Received: zipf_exponent={self.zipf_exponent}")
        if any(not isinstance(e, (int, float)) or e < 0 for e in self.feature_zipf_exponents):
            raise ValueError("Expected feature_zipf_exponents >= 0 (0 = uniform). "
                             f"Received: feature_zipf_exponents={self.feature_zipf_exponents}")
        if not 0 < self.positive_rate < 1:
            raise ValueError(f"Expected 0 < positive_rate < 1. Received: positive_rate={self.positive_rate}")
        if self.logit_std < 0:
            raise ValueError(f"Expected logit_std >= 0. Received: logit_std={self.logit_std}")
        if self.numerical_share < 0 or self.pairwise_share < 0 or self.numerical_share + self.pairwise_share > 1:
            raise ValueError(
                "Expected non-negative shares summing to at most 1. Received: "
                f"numerical_share={self.numerical_share}, pairwise_share={self.pairwise_share}"
            )


class _IdMap:
    """A random bijection popularity rank -> id over ``[0, cardinality)``."""

    def __init__(self, cardinality: int, rng: np.random.Generator):
        self.cardinality = cardinality
        if cardinality <= MAX_EXPLICIT_PERMUTATION:
            self._table = rng.permutation(cardinality).astype(np.int64)
        else:
            self._table = None
            multiplier = int(rng.integers(1, cardinality))
            while math.gcd(multiplier, cardinality) != 1:
                multiplier = int(rng.integers(1, cardinality))
            self._multiplier, self._offset = multiplier, int(rng.integers(0, cardinality))

    def __call__(self, ranks: np.ndarray) -> np.ndarray:
        if self._table is not None:
            return self._table[ranks]
        return (ranks * self._multiplier + self._offset) % self.cardinality


def _power_law_ranks(rng: np.random.Generator, count: int, cardinality: int, exponent: float) -> np.ndarray:
    """Ranks in ``[0, cardinality)`` with ``P(rank = k) ~ (k + 1) ** -exponent`` (approximately).

    Inverse CDF of the continuous power law on ``[1, cardinality + 1)``, floored: one uniform and
    one ``pow`` per sample, no table of probabilities.
    """
    values = _power_law_inverse_cdf(rng.random(count), float(cardinality + 1), exponent)
    return np.minimum(values.astype(np.int64) - 1, cardinality - 1)


def _power_law_inverse_cdf(uniform: np.ndarray, top: float, exponent: float) -> np.ndarray:
    """Values in ``[1, top)`` with density ``~ x ** -exponent``, from uniform draws in ``[0, 1)``."""
    if abs(exponent - 1.0) < 1e-9:
        return np.exp(uniform * math.log(top))
    power = 1.0 - exponent
    return (1.0 + uniform * (top**power - 1.0)) ** (1.0 / power)


def power_law_lengths(rng: np.random.Generator, count: int, hotness: int, exponent: float) -> np.ndarray:
    """Row lengths in ``[1, hotness]``, mostly short: the inverse CDF of a continuous power law
    ``p(x) ~ x ** -exponent`` applied to uniform draws and truncated, as NVIDIA's synthetic generator
    (DLRM_and_DCNv2 ``dataloading/synthetic_dataset.py``, ``variable_hotness``) draws them. Theirs
    takes the law on ``[1, hotness)``, so truncation never reaches ``hotness`` itself; here the upper
    end is ``hotness + 1`` so that full rows occur. ``exponent`` 0 gives uniform lengths."""
    if hotness == 1:
        return np.ones(count, np.int64)
    if exponent == 0:
        return rng.integers(1, hotness + 1, count)
    values = _power_law_inverse_cdf(rng.random(count), float(hotness + 1), exponent)
    return np.clip(values.astype(np.int64), 1, hotness)


def padded_rows(flat: np.ndarray, lengths: np.ndarray, hotness: int, fill: int = -1) -> np.ndarray:
    """``[count, hotness]``: row ``i`` holds the next ``lengths[i]`` values of ``flat``, then ``fill``."""
    out = np.full((lengths.shape[0], hotness), fill, dtype=flat.dtype)
    out[np.arange(hotness)[None, :] < lengths[:, None]] = flat
    return out


class HiddenModel:
    """The ground truth: draws samples and gives their true click logits.

    Args:
        spec: a FeatureSpec (only its channels, dtypes and cardinalities are used).
        seed: everything below derives from it.
        config: the distribution's shape.
    """

    def __init__(self, spec: FeatureSpec, seed: int, config: GeneratorConfig = GeneratorConfig()):
        self.config = config
        self.cardinalities = spec.cardinalities()
        # Multi-hot features draw `hotness` ids per sample; their effects pool like the model does.
        self.hotness = [spec.hotness(name) for name in spec.categorical_features]
        self.combiners = [spec.combiner(name) for name in spec.categorical_features]
        self.num_numerical = len(spec.numerical_features)
        self.numerical_dtype = spec.numerical_dtype()
        rng = np.random.default_rng([seed, 0])
        # Heavy-tailed counts: floor(lognormal), a different location and spread per feature.
        self.count_mu = rng.uniform(0.0, 3.0, self.num_numerical)
        self.count_sigma = rng.uniform(0.8, 2.0, self.num_numerical)
        self.numerical_weights = rng.normal(size=self.num_numerical)
        self.id_maps, self.effects, self.vectors = [], [], {}
        num_tables = len(self.cardinalities)
        self.pairs = [(a, a + 1) for a in range(0, num_tables - 1, 2)][:MAX_PAIRS]
        paired = {t for pair in self.pairs for t in pair}
        for table, cardinality in enumerate(self.cardinalities):
            self.id_maps.append(_IdMap(cardinality, rng))
            ranks = np.arange(min(cardinality, MAX_EFFECT_RANKS), dtype=np.float64)
            shrink = (1.0 + ranks / config.effect_head) ** -config.effect_decay
            self.effects.append(rng.normal(size=ranks.shape[0]) * shrink)
            if table in paired:
                self.vectors[table] = rng.normal(size=(ranks.shape[0], HIDDEN_DIM)) * shrink[:, None]
        # Calibration: standardise the numerical part, scale the parts, solve the bias.
        self.numerical_mean = np.zeros(self.num_numerical)
        self.numerical_std = np.ones(self.num_numerical)
        self.part_scales = np.ones(3)
        self.bias = 0.0
        numerical, ranks, _ = self.sample(np.random.default_rng([seed, 3]), _CALIBRATION_SAMPLES)
        wide = numerical.astype(np.float64)  # float16 sums overflow
        self.numerical_mean = wide.mean(axis=0)
        self.numerical_std = np.maximum(wide.std(axis=0), 1e-6)
        parts = self._parts(numerical, ranks)
        shares = np.array([config.numerical_share, 1.0 - config.numerical_share - config.pairwise_share, config.pairwise_share])
        spreads = np.array([part.std() for part in parts])
        # Each part to its share of the variance; then the sum (parts are nearly independent) to logit_std.
        self.part_scales = np.sqrt(shares) * config.logit_std / np.where(spreads > 0, spreads, np.inf)
        total = float(np.std(sum(scale * part for scale, part in zip(self.part_scales, parts))))
        if total > 0:
            self.part_scales *= config.logit_std / total
        self.bias = _solve_bias(self.logits(numerical, ranks), config.positive_rate)

    def sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """``count`` samples: numerical ``[count, n]`` in the spec's dtype, then ranks and ids per table."""
        numerical = np.empty((count, self.num_numerical), self.numerical_dtype)
        for j in range(self.num_numerical):
            counts = np.floor(rng.lognormal(self.count_mu[j], self.count_sigma[j], count))
            numerical[:, j] = np.log1p(counts)
        ranks, ids = [], []
        # Variable rows (config.variable_hotness) are [count, hotness] with -1 past each row's length.
        if self.config.feature_zipf_exponents and len(self.config.feature_zipf_exponents) != len(self.cardinalities):
            raise ValueError(f"Expected {len(self.cardinalities)} feature_zipf_exponents (one per categorical "
                             f"feature). Received: {len(self.config.feature_zipf_exponents)}")
        for feature, (cardinality, id_map, hotness) in enumerate(zip(self.cardinalities, self.id_maps, self.hotness)):
            exponent = self.config.exponent_of(feature)
            variable = self.config.variable_hotness and hotness > 1
            lengths = power_law_lengths(rng, count, hotness, exponent) if variable else None
            total = int(lengths.sum()) if variable else count * hotness
            if exponent == 0:
                table_ranks = rng.integers(0, cardinality, total)
            else:
                table_ranks = _power_law_ranks(rng, total, cardinality, exponent)
            if variable:
                table_ranks = padded_rows(table_ranks, lengths, hotness)
                ranks.append(table_ranks)
                ids.append(np.where(table_ranks >= 0, id_map(np.maximum(table_ranks, 0)), -1))
                continue
            if hotness > 1:
                table_ranks = table_ranks.reshape(count, hotness)
            ranks.append(table_ranks)
            ids.append(id_map(table_ranks))
        return numerical, ranks, ids

    def _parts(self, numerical: np.ndarray, ranks: Sequence[np.ndarray]) -> list[np.ndarray]:
        count = numerical.shape[0]
        standardised = (numerical.astype(np.float64) - self.numerical_mean) / self.numerical_std
        numerical_part = standardised @ self.numerical_weights if self.num_numerical else np.zeros(count)
        scalar_part = np.zeros(count)
        for table, (table_ranks, effects) in enumerate(zip(ranks, self.effects)):
            scalar_part += self._pooled(table, effects, table_ranks)
        pairwise_part = np.zeros(count)
        for a, b in self.pairs:
            pairwise_part += np.einsum("ij,ij->i", self._pooled(a, self.vectors[a], ranks[a]),
                                       self._pooled(b, self.vectors[b], ranks[b]))
        return [numerical_part, scalar_part, pairwise_part]

    def _pooled(self, table: int, values: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """Per-sample effects of a table: its ids' values pooled by the feature's combiner."""
        if ranks.ndim == 1:
            return _lookup(values, ranks)
        present = ranks >= 0  # variable rows end in -1
        if present.all():
            looked_up = _lookup(values, ranks.reshape(-1)).reshape(ranks.shape + values.shape[1:])
            total = looked_up.sum(axis=1)
            hotness = ranks.shape[1]
            return {"sum": total, "mean": total / hotness, "sqrtn": total / np.sqrt(hotness)}[self.combiners[table]]
        looked_up = _lookup(values, np.maximum(ranks, 0).reshape(-1)).reshape(ranks.shape + values.shape[1:])
        mask = present.reshape(present.shape + (1,) * (looked_up.ndim - 2))
        total = np.where(mask, looked_up, 0.0).sum(axis=1)
        # The model's combiners: mean and sqrtn divide by the row's own count; an empty row pools to zeros.
        count = np.maximum(present.sum(axis=1), 1).astype(np.float64).reshape((-1,) + (1,) * (total.ndim - 1))
        return {"sum": total, "mean": total / count, "sqrtn": total / np.sqrt(count)}[self.combiners[table]]

    def logits(self, numerical: np.ndarray, ranks: Sequence[np.ndarray]) -> np.ndarray:
        parts = self._parts(numerical, ranks)
        return self.bias + sum(scale * part for scale, part in zip(self.part_scales, parts))


def _lookup(values: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Rows of ``values`` for ``ranks``; ranks past the stored effects get zeros."""
    if ranks.size and ranks.max() < values.shape[0]:
        return values[ranks]
    inside = ranks < values.shape[0]
    out = np.zeros((ranks.shape[0],) + values.shape[1:])
    out[inside] = values[ranks[inside]]
    return out


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * logits))  # overflow-free form of 1 / (1 + exp(-x))


def _solve_bias(logits: np.ndarray, positive_rate: float) -> float:
    """The shift ``c`` with ``mean(sigmoid(logits + c)) = positive_rate`` (bisection)."""
    low, high = -30.0, 30.0
    for _ in range(60):
        middle = 0.5 * (low + high)
        if sigmoid(logits + middle).mean() < positive_rate:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)
