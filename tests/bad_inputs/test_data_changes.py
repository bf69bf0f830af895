"""A data file that changes under a running job: the reader names it instead of a bare tf.data traceback."""

from __future__ import annotations

import os
import time

import pytest

from tf_dlrm.data.reader import SplitBinaryReader
from tf_dlrm.data.validation import BadDataError, message_of
from tf_dlrm.spec.feature_spec import FeatureSpec
from tiny_dataset import write_tiny


def test_a_file_truncated_while_reading_is_named(tmp_path):
    data = write_tiny(tmp_path / "data")
    spec = FeatureSpec.load(os.path.join(data, "feature_spec.yaml"))
    reader = SplitBinaryReader(spec, "train", 256)
    reader.read_batch(0)
    path = os.path.join(data, "train", "cat_1.bin")
    os.truncate(path, 1000)  # another process rewrites the dataset meanwhile
    with pytest.raises(BadDataError, match=rf"{path}: read 0 of 512 bytes at offset 3584 \(split 'train'\): the file "
                                           r"changed under the running job, it now has 1000 bytes and 4096 were expected"):
        reader.read_batch(7)
    # Through tf.data the message comes back out of TensorFlow's error (at batch 0 already, which the file still holds:
    # its size moved on since it was opened).
    with pytest.raises(Exception) as wrapped:
        list(reader.dataset(epoch=0))
    assert message_of(wrapped.value).startswith(f"{path}: written to since the job opened it (modified at ")
    assert "4096 bytes then, 1000 now) (split 'train'): the file changed under the running job" in message_of(wrapped.value)


def test_a_file_overwritten_in_place_is_refused_at_the_next_read(tmp_path):
    """Same size, other bytes (a writer that opens the file for writing rather than replacing it): before, the job
    read the new labels and trained on them without a word."""
    data = write_tiny(tmp_path / "data")
    spec = FeatureSpec.load(os.path.join(data, "feature_spec.yaml"))
    reader = SplitBinaryReader(spec, "train", 256)
    reader.read_batch(0)
    path = os.path.join(data, "train", "label.bin")
    original = open(path, "rb").read()
    time.sleep(0.05)  # the clock of file times moves in ticks of a few ms: written just now, the file must age one
    with open(path, "r+b") as handle:
        handle.write(bytes(byte ^ 1 for byte in original))
    with pytest.raises(BadDataError, match=rf"{path}: written to since the job opened it \(modified at [\d:]+; "
                                           rf"{len(original)} bytes then, {len(original)} now\) \(split 'train'\): the "
                                           r"file changed under the running job; no step trained on its new bytes\. Put "
                                           r"the data back as it was and continue with --resume"):
        reader.read_batch(1)
    with pytest.raises(Exception) as wrapped:
        list(reader.dataset(epoch=0))
    assert f"{path}: written to since the job opened it" in message_of(wrapped.value)


def test_a_file_replaced_by_a_rename_is_read_as_it_was(tmp_path):
    """A dataset tool publishes by a rename: the running job reads on the file it opened (the next --resume compares
    the data's fingerprint)."""
    data = write_tiny(tmp_path / "data")
    spec = FeatureSpec.load(os.path.join(data, "feature_spec.yaml"))
    reader = SplitBinaryReader(spec, "train", 256)
    before = reader.read_batch(1)
    path = os.path.join(data, "train", "label.bin")
    time.sleep(0.05)
    with open(path + ".new", "wb") as handle:
        handle.write(bytes(byte ^ 1 for byte in open(path, "rb").read()))
    os.link(path, path + ".original")
    os.rename(path + ".new", path)
    after = reader.read_batch(1)
    assert all((x == y).all() for x, y in zip(before, after) if hasattr(x, "all"))
