"""Synthetic generator: determinism, oracle metadata, id ranges, power-law skew, crash safety, CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tf_dlrm.data import hidden_model, synthetic
from tf_dlrm.data.layout import nvidia_spec
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.metrics import exact_auc, logloss

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_SPEC = os.path.join(REPO, "feature_specs", "synthetic_small.yaml")


def _files(directory) -> dict[str, bytes]:
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = open(path, "rb").read()
    return found


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """synthetic_small with 40k train / 10k validation / 6k test samples, generated in 16k-sample blocks."""
    directory = tmp_path_factory.mktemp("synthetic_small")
    spec = FeatureSpec.load(SMALL_SPEC, check_files=False)
    written = synthetic.generate(spec, str(directory), 40_000, 10_000, seed=7, block_size=16_384, num_test_samples=6_000)
    return directory, written


def test_specs_in_repository_load():
    small = FeatureSpec.load(SMALL_SPEC, check_files=False)
    assert len(small.numerical_features) == 13 and small.numerical_dtype() == np.float16
    cardinalities = small.cardinalities()
    assert len(cardinalities) == 8 and min(cardinalities) >= 3 and max(cardinalities) <= 5000
    assert any(c < 2048 for c in cardinalities) and sum(c > 2048 for c in cardinalities) >= 2
    capped = FeatureSpec.load(os.path.join(REPO, "feature_specs", "criteo_capped.yaml"), check_files=False)
    assert capped.cardinalities()[:9] == [100000] * 8 + [39060]
    assert capped.cardinalities()[-3:] == [10, 4, 3] and len(capped.cardinalities()) == 26
    assert capped.categorical_features == [f"cat_{i}.bin" for i in range(26)]
    assert capped.numerical_features == [f"num_{i}" for i in range(13)]


def test_written_spec_and_metadata(small):
    directory, written = small
    spec = FeatureSpec.load(str(directory / "feature_spec.yaml"))  # checks every file's size
    assert spec.to_dict() == written.to_dict()
    assert spec.split_files("train").num_samples == 40_000
    # A validation split to choose by and a test split to report: NVIDIA's names are train and test.
    assert spec.splits == ["train", "validation", "test"]
    assert spec.split_files("validation").num_samples == 10_000 and spec.split_files("test").num_samples == 6_000
    metadata = spec.metadata
    assert 0.75 <= metadata["oracle_valid_auc"] <= 0.88 and 0.75 <= metadata["oracle_test_auc"] <= 0.88
    assert metadata["oracle_valid_auc"] != metadata["oracle_test_auc"]  # other samples
    assert 0.3 < metadata["oracle_valid_logloss"] < 0.6 and 0.3 < metadata["oracle_test_logloss"] < 0.6
    assert 0.18 < metadata["train_positive_rate"] < 0.35
    assert (metadata["num_train_samples"], metadata["num_valid_samples"], metadata["num_test_samples"],
            metadata["seed"]) == (40_000, 10_000, 6_000, 7)
    assert isinstance(metadata["generator"], str) and metadata["generator"]
    assert not any(name.endswith((".partial", ".tmp")) for name in _files(directory))


def test_oracle_auc_is_the_auc_of_the_hidden_probabilities(small):
    directory, written = small
    labels = np.fromfile(directory / "validation" / "label.bin", np.bool_)
    assert 0.18 < labels.mean() < 0.35
    # Replay the validation split (one block of 10k, stream [seed, 2, 0]) from the hidden model.
    model = hidden_model.HiddenModel(written, seed=7)
    rng = np.random.default_rng([7, 2, 0])
    numerical, ranks, ids = model.sample(rng, 10_000)
    probabilities = 1 / (1 + np.exp(-model.logits(numerical, ranks)))
    np.testing.assert_array_equal(rng.random(10_000) < probabilities, labels)
    np.testing.assert_array_equal(ids[3], np.fromfile(directory / "validation" / "cat_3.bin", written.dtype("cat_3.bin")))
    assert exact_auc(labels, probabilities) == pytest.approx(written.metadata["oracle_valid_auc"], abs=1e-6)
    assert logloss(labels, probabilities) == pytest.approx(written.metadata["oracle_valid_logloss"], abs=1e-6)
    # The test split (stream [seed, 3, 0]): its oracle figures are the hidden model's on its own labels.
    test_labels = np.fromfile(directory / "test" / "label.bin", np.bool_)
    rng = np.random.default_rng([7, 3, 0])
    numerical, ranks, _ = model.sample(rng, 6_000)
    test_probabilities = 1 / (1 + np.exp(-model.logits(numerical, ranks)))
    np.testing.assert_array_equal(rng.random(6_000) < test_probabilities, test_labels)
    assert exact_auc(test_labels, test_probabilities) == pytest.approx(written.metadata["oracle_test_auc"], abs=1e-6)
    assert logloss(test_labels, test_probabilities) == pytest.approx(written.metadata["oracle_test_logloss"], abs=1e-6)
    # the hidden model is much better than chance and than a constant
    assert logloss(labels, np.full(labels.shape, labels.mean())) > written.metadata["oracle_valid_logloss"] + 0.05


def test_ids_in_range_and_numerical_values(small):
    directory, written = small
    for name, cardinality in zip(written.categorical_features, written.cardinalities()):
        ids = np.fromfile(directory / "train" / name, written.dtype(name))
        assert ids.min() >= 0 and ids.max() < cardinality, name
        assert len(np.unique(ids)) >= min(cardinality, 50), name  # more than a handful of ids
    numerical = np.fromfile(directory / "train" / "numerical.bin", np.float16).reshape(40_000, 13)
    assert np.isfinite(numerical).all() and numerical.min() >= 0
    # stored as log(1 + count): the counts are integers with a heavy right tail, zeros included
    counts = np.expm1(numerical.astype(np.float64))
    np.testing.assert_allclose(counts[counts < 100], np.round(counts[counts < 100]), rtol=2e-3, atol=1e-3)
    assert (counts.max(axis=0) > 10 * (np.median(counts, axis=0) + 1)).all()
    assert (numerical == 0).mean() > 0.01


def test_power_law_skew_with_permuted_ids(small):
    directory, written = small
    name, cardinality = written.categorical_features[-1], written.cardinalities()[-1]
    ids = np.fromfile(directory / "train" / name, written.dtype(name))
    counts = np.bincount(ids, minlength=cardinality)
    top = np.argsort(counts)[::-1][: cardinality // 100]
    assert counts[top].sum() / ids.size > 0.5  # the top 1% of ids hold most of the samples
    assert np.mean(top < cardinality // 100) < 0.5  # ... and they are not simply the smallest ids


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    spec = nvidia_spec(4, [3, 60, 3000], splits=())
    for name in ("a", "b"):
        synthetic.generate(spec, str(tmp_path / name), 5000, 2000, seed=11, block_size=2048)
    synthetic.generate(spec, str(tmp_path / "c"), 5000, 2000, seed=12, block_size=2048)
    a, b, c = (_files(tmp_path / name) for name in "abc")
    # (.tf_dlrm_output.json: the manifest of the files the generator wrote, see tf_dlrm.io.publish)
    assert sorted(a) == [".tf_dlrm_output.json", "feature_spec.yaml"] + sorted(f"{s}/{f}" for s in ("train", "validation") for f in (
        "cat_0.bin", "cat_1.bin", "cat_2.bin", "label.bin", "numerical.bin"))
    assert a == b
    assert all(a[name] != c[name] for name in a if name.endswith(".bin"))


def test_failure_leaves_existing_dataset_untouched(tmp_path, monkeypatch):
    spec = nvidia_spec(2, [10, 100], splits=())
    synthetic.generate(spec, str(tmp_path), 3000, 1000, seed=1, block_size=1024)
    before = _files(tmp_path)
    calls = {"count": 0}
    real_sample = hidden_model.HiddenModel.sample

    def sample_then_fail(self, rng, count):
        calls["count"] += 1
        if calls["count"] == 4:  # calibration, two train blocks, then fail
            raise RuntimeError("interrupted")
        return real_sample(self, rng, count)

    monkeypatch.setattr(hidden_model.HiddenModel, "sample", sample_then_fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        synthetic.generate(spec, str(tmp_path), 5000, 1000, seed=2, block_size=1024)
    assert _files(tmp_path) == before


def test_argument_errors(tmp_path):
    spec = nvidia_spec(1, [5], splits=())
    with pytest.raises(ValueError, match="num_train_samples=-1"):
        synthetic.generate(spec, str(tmp_path), -1, 10)
    with pytest.raises(ValueError, match="positive_rate=1.5"):
        hidden_model.GeneratorConfig(positive_rate=1.5)


def test_command_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    output = tmp_path / "out"
    command = [sys.executable, "-m", "tf_dlrm.data.synthetic", f"--feature_spec={SMALL_SPEC}", f"--output_dir={output}",
               "--num_train_samples=3000", "--num_valid_samples=1000", "--seed=3"]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "oracle_valid_auc=" in completed.stdout and "oracle_test_auc" not in completed.stdout
    spec = FeatureSpec.load(str(output / "feature_spec.yaml"))
    assert spec.metadata["seed"] == 3 and spec.splits == ["train", "validation"]
    assert spec.split_files("validation").num_samples == 1000 and "oracle_test_auc" not in spec.metadata
    # --num_test_samples adds the test split and its oracle AUC, which the summary line names too.
    tested = subprocess.run(command + ["--num_test_samples=500"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert tested.returncode == 0, tested.stderr
    spec = FeatureSpec.load(str(output / "feature_spec.yaml"))
    assert spec.splits == ["train", "validation", "test"] and spec.split_files("test").num_samples == 500
    assert "+ 500 test samples" in tested.stdout and f"oracle_test_auc={spec.metadata['oracle_test_auc']}" in tested.stdout

    bad = subprocess.run(command[:3] + [f"--feature_spec={tmp_path / 'absent.yaml'}"] + command[4:],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "absent.yaml" in bad.stderr


def test_per_feature_id_distribution(small):
    _, written = small
    features = len(written.categorical_features)
    exponents = tuple([0.0, 2.0] + [1.05] * (features - 2))
    model = hidden_model.HiddenModel(written, seed=3, config=hidden_model.GeneratorConfig(feature_zipf_exponents=exponents))
    _, ranks, _ = model.sample(np.random.default_rng(0), 20_000)
    cardinality = written.cardinalities()
    uniform, skewed = np.asarray(ranks[0]).ravel(), np.asarray(ranks[1]).ravel()
    # Uniform: the top rank has about 1/cardinality of the mass; exponent 2: about 1/zeta(2) = 0.61.
    assert abs(np.mean(uniform == 0) - 1 / cardinality[0]) < 5 * np.sqrt(1 / cardinality[0] / 20_000) + 1e-3
    assert np.mean(skewed == 0) > 0.4
    with pytest.raises(ValueError, match="feature_zipf_exponents >= 0"):
        hidden_model.GeneratorConfig(feature_zipf_exponents=(1.0, -1.0))
    with pytest.raises(ValueError, match=f"Expected {features} feature_zipf_exponents"):
        hidden_model.HiddenModel(written, seed=3, config=hidden_model.GeneratorConfig(feature_zipf_exponents=(1.0,))).sample(
            np.random.default_rng(0), 4)
