"""``--model=package.module:Class`` models that fail: one line each, naming the model (and where it raised),
exit 2, no traceback."""

from __future__ import annotations

import os
import textwrap

import pytest

from conftest import REPO, run_python
from tiny_dataset import write_tiny

pytestmark = pytest.mark.slow

PLUGINS = textwrap.dedent('''
    import tensorflow as tf
    from tf_dlrm.models.layers.mlp import MLP
    from tf_dlrm.models.ranking_model import RankingModel


    class RaisesInBuild(RankingModel):
        def build_dense(self, input_shape):
            raise RuntimeError("my model is broken")

        def dense_call(self, numerical, embeddings):
            return numerical[:, :1]


    class NoTables(RankingModel):
        @classmethod
        def tables(cls, config, deep, crossed=()):
            return []

        def dense_call(self, numerical, embeddings):
            return numerical[:, :1]


    class IgnoresEmbeddings(RankingModel):
        def create_layers(self):
            self.mlp = MLP((4, 1), final_activation=None, seed=self.seed, name="mlp")

        def build_dense(self, input_shape):
            self.mlp.build((None, self.num_numerical))

        def dense_call(self, numerical, embeddings):
            return tf.cast(self.mlp(tf.cast(numerical, self.compute_dtype)), tf.float32)
''')

CASES = {
    "bad_models:RaisesInBuild":
        "error (rank 0): --model=bad_models:RaisesInBuild: RaisesInBuild failed in its construction or build: "
        "RuntimeError: my model is broken (bad_models.py:9, in build_dense)",
    "no_such_module:Model":
        "error (rank 0): --model=no_such_module:Model: cannot import module 'no_such_module' (No module named "
        "'no_such_module'); is it on PYTHONPATH?",
    "bad_models:NoTables":
        "error (rank 0): --model=bad_models:NoTables: NoTables.tables() gave no embedding table. Expected at least one "
        "(the spec's 2 categorical features give one each). Received: tables=[]",
    "bad_models:IgnoresEmbeddings":
        "error (rank 0): IgnoresEmbeddings: the loss does not depend on its embedding tables (no gradient reaches the "
        "variable(s) ['shards_w4']). Expected the model's output to use the embeddings it is given (in dense_call). "
        "Received: 1 of 1 table variables without a gradient",
}


@pytest.mark.parametrize("model", list(CASES))
def test_a_failing_model_plugin_gets_one_line(tmp_path, model):
    data = write_tiny(tmp_path / "data")
    (tmp_path / "bad_models.py").write_text(PLUGINS)
    completed = run_python(["main.py", f"--dataset_path={data}", "--embedding_dim=4", "--batch_size=256", "--max_steps=2",
                            f"--model={model}"], check=False, timeout=300,
                           env={"PYTHONPATH": os.pathsep.join([REPO, str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert completed.stderr.strip().splitlines()[-1] == CASES[model]
