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


def test_row_bands_that_do_not_tile_the_table_are_refused_naming_the_rows(tmp_path):
    """A manifest's row bands must cover every row once (a band lost, or two that overlap): one line naming the rows."""
    import numpy as np
    import pytest

    from tf_dlrm.checkpoint.slices import open_slices, read_table
    from tf_dlrm.checkpoint.store import CheckpointError

    values = np.arange(40, dtype=np.float32).reshape(10, 4)
    for name, rows in (("a.npy", (0, 6)), ("b.npy", (6, 10)), ("c.npy", (4, 10))):
        np.save(tmp_path / name, values[rows[0]:rows[1]])
    entry = {"name": "t", "rows": 10, "dim": 4, "slices": [{"columns": [0, 4], "rows": [0, 6], "file": "a.npy"},
                                                           {"columns": [0, 4], "rows": [6, 10], "file": "b.npy"}]}
    np.testing.assert_array_equal(read_table(str(tmp_path), entry), values)  # two bands read back as one table
    gap = {**entry, "slices": entry["slices"][:1]}
    with pytest.raises(CheckpointError, match=r"'t' has no slice for rows \[6, 10\)"):
        open_slices(str(tmp_path), gap, 10, 4)
    overlap = {**entry, "slices": [entry["slices"][0], {"columns": [0, 4], "rows": [4, 10], "file": "c.npy"}]}
    with pytest.raises(CheckpointError, match=r"'t' has row bands that do not cover rows \[0, 10\) once: \[4, 10\) after row 6"):
        open_slices(str(tmp_path), overlap, 10, 4)
