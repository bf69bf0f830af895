"""A slice that cannot be written (a full disk, a path that is not a directory) ends the save with one line naming
the file, not an AttributeError from inside the error message (a parameter once shadowed the files module)."""

from __future__ import annotations


def test_an_unwritable_slice_is_named_in_one_line(tmp_path):
    from tf_dlrm.checkpoint.slices import save_pieces
    from tf_dlrm.embedding import DistributedEmbedding, FeatureConfig, TableConfig
    from tf_dlrm.parallel.env import DistributedEnv

    layer = DistributedEmbedding([FeatureConfig("a", TableConfig("a", 20, 4))], env=DistributedEnv(), name="embedding")
    layer.build()
    blocked = tmp_path / "not_a_directory"
    blocked.write_text("a file where the checkpoint's tables/ folder would go")
    written = {}
    records, error = save_pieces(layer, 0, str(blocked), [("table", 0, None, False)], written)
    assert records == [] and written == {}
    assert error.startswith(f"cannot write {blocked}/tables/table_000") and "\n" not in error, error
