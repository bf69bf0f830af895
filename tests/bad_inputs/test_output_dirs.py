"""Output directories: every writer stages its output in a temporary sibling, publishes it with a
rename, replaces only its own earlier output, and never deletes a user's file or its own input."""

from __future__ import annotations

import os
import shutil

import pytest

from preprocessing.criteo import PreprocessConfig, preprocess
from tf_dlrm.data.synthetic import generate
from tf_dlrm.data.transcode import transcode
from tf_dlrm.spec.feature_spec import FeatureSpec
from tf_dlrm.io.publish import MANIFEST, OutputDirectoryError
from tiny_dataset import write_tiny

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BYO = os.path.join(REPO, "feature_specs", "byo_example")

@pytest.fixture
def tsv(generated_criteo):
    """Criteo-format rows: the writers' directory handling, not the data, is under test."""
    return generated_criteo.tsv


def listing(directory) -> dict:
    """Every file under ``directory`` with its bytes."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = open(path, "rb").read()
    return found


def criteo(inputs, output_dir):
    return preprocess(PreprocessConfig(inputs=tuple(str(p) for p in inputs), output_dir=str(output_dir), num_workers=1))


def test_criteo_refuses_a_directory_with_a_spec_and_a_users_notes(tmp_path, tsv):
    out = tmp_path / "out"
    out.mkdir()
    (out / "feature_spec.yaml").write_text("feature_spec: {}\n")
    (out / "notes.txt").write_text("my notes")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "ckpt.npy").write_bytes(b"weights")
    before = listing(out)
    with pytest.raises(OutputDirectoryError, match=r"--output_dir=\S+out is not empty and was not written by "
                                                   r"preprocessing.criteo .*refusing to replace it"):
        criteo([tsv], out)
    assert listing(out) == before
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no temporary sibling left


def test_criteo_never_deletes_the_input_it_reads(tmp_path, tsv):
    out = tmp_path / "out"
    criteo([tsv], out)  # an earlier output of the tool, with its manifest
    shutil.copy(tsv, out / "day_0.tsv")
    with pytest.raises(OutputDirectoryError, match=r"holds \S+day_0.tsv, an input of this run"):
        criteo([out / "day_0.tsv"], out)
    assert (out / "day_0.tsv").read_bytes() == open(tsv, "rb").read()


def test_criteo_replaces_its_own_earlier_output_but_not_after_a_user_added_a_file(tmp_path, tsv):
    out = tmp_path / "out"
    criteo([tsv], out)
    assert os.path.isfile(out / MANIFEST)
    criteo([tsv], out)  # its own files only: replaced
    (out / "README.txt").write_text("what this dataset is")
    with pytest.raises(OutputDirectoryError, match=r"holds 1 file\(s\) that preprocessing.criteo did not write, e.g. README.txt"):
        criteo([tsv], out)
    assert (out / "README.txt").read_text() == "what this dataset is"


def test_criteo_into_a_copy_of_the_byo_example_keeps_its_csvs_and_script(tmp_path, tsv):
    byo = tmp_path / "byo"
    shutil.copytree(BYO, byo)
    before = listing(byo)
    with pytest.raises(OutputDirectoryError, match="refusing to replace it"):
        criteo([tsv], byo)
    assert listing(byo) == before


def test_transcode_in_place_is_refused(tmp_path):
    byo = tmp_path / "byo"
    shutil.copytree(BYO, byo)
    before = listing(byo)
    with pytest.raises(OutputDirectoryError, match=r"holds \S+feature_spec.yaml, an input of this run"):
        transcode(str(byo / "feature_spec.yaml"), str(byo))
    assert listing(byo) == before
    # Into a fresh directory it works, and again into its own output.
    for _ in range(2):
        spec = transcode(str(byo / "feature_spec.yaml"), str(tmp_path / "binary"))
        assert FeatureSpec.load(spec.source).splits == ["train", "test"]
    assert sorted(os.listdir(tmp_path)) == ["binary", "byo"]


def test_transcode_and_synthetic_refuse_foreign_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputDirectoryError, match="not written by tf_dlrm.data.transcode"):
        transcode(os.path.join(BYO, "feature_spec.yaml"), str(out))
    spec = FeatureSpec.load(os.path.join(REPO, "feature_specs", "synthetic_small.yaml"), check_files=False)
    with pytest.raises(OutputDirectoryError, match="not written by tf_dlrm.data.synthetic"):
        generate(spec, str(out), 100, 10)
    assert listing(out) == {"keep.txt": b"mine"}
    # A directory written by another tool is not replaced either.
    data = write_tiny(tmp_path / "tiny")  # written by hand: no manifest
    with pytest.raises(OutputDirectoryError, match="refusing to replace it"):
        generate(spec, data, 100, 10)
    written = generate(spec, str(tmp_path / "synthetic"), 100, 10)
    with pytest.raises(OutputDirectoryError, match="was written by tf_dlrm.data.synthetic, not tf_dlrm.data.transcode"):
        transcode(os.path.join(BYO, "feature_spec.yaml"), written.base_directory)
