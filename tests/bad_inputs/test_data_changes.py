"""A data file that changes under a running job: the reader names it instead of a bare tf.data traceback."""

from __future__ import annotations

import os

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
    # Through tf.data the same message comes back out of TensorFlow's error.
    with pytest.raises(Exception) as wrapped:
        list(reader.dataset(epoch=0))
    assert f"{path}: read" in message_of(wrapped.value)
