"""A remote output path is checked before the run, like a local one: a scheme TensorFlow has no
filesystem for, or a file where a directory is expected, is refused naming the flag."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

tf = pytest.importorskip("tensorflow")

from tf_dlrm.cli import preflight  # noqa: E402
from tf_dlrm.io import files  # noqa: E402


def _has_s3() -> bool:
    try:
        tf.io.gfile.exists("s3://bucket/key")
    except tf.errors.UnimplementedError:
        return False
    except tf.errors.OpError:
        pass
    return True


def outputs(**paths) -> SimpleNamespace:
    return SimpleNamespace(**{"save_checkpoint_path": None, "tensorboard_dir": None, "log_path": None, **paths})


@pytest.mark.skipif(_has_s3(), reason="an s3:// filesystem plugin is installed here")
def test_a_scheme_without_a_filesystem_is_refused_naming_the_flag_and_the_plugin():
    with pytest.raises(ValueError, match=r"^--save_checkpoint_path=s3://bucket/run: .*no filesystem for 's3://'.*tensorflow-io"):
        preflight.check_output_paths(outputs(save_checkpoint_path="s3://bucket/run"))
    with pytest.raises(ValueError, match=r"^--log_path=s3://bucket/run.jsonl: "):
        preflight.check_output_paths(outputs(log_path="s3://bucket/run.jsonl"))


def test_a_remote_file_is_no_checkpoint_directory_and_a_remote_directory_no_log():
    root = f"ram://preflight_{uuid.uuid4().hex}"
    files.makedirs(files.join(root, "logs"))
    with files.open_file(files.join(root, "taken"), "w") as handle:
        handle.write("x")
    with pytest.raises(ValueError, match=r"^--save_checkpoint_path=ram://.*/taken is a file; expected a directory"):
        preflight.check_output_paths(outputs(save_checkpoint_path=files.join(root, "taken")))
    with pytest.raises(ValueError, match=r"^--log_path=ram://.*/logs is a directory; expected a file name"):
        preflight.check_output_paths(outputs(log_path=files.join(root, "logs")))
    preflight.check_output_paths(outputs(save_checkpoint_path=files.join(root, "new"), log_path=files.join(root, "logs", "a.jsonl"),
                                         tensorboard_dir=files.join(root, "tb")))
    files.rmtree(root)
