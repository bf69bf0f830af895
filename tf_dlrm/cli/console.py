"""The console scripts an install makes (``setup.cfg``'s ``console_scripts``): ``tf-dlrm-train``, ``tf-dlrm-synthetic``,
``tf-dlrm-transcode``, ``tf-dlrm-apply-deltas``.

pip's wrapper imports the function it names before calling it. Naming the tool's own ``run`` would import the whole
tool (TensorFlow, numpy) before the tool's stop handlers exist, so a stop signal in that window killed it without a
line or, ignored at the start, was lost (:mod:`tf_dlrm.io.early_stop`). Each function here answers the signals first,
as ``python main.py`` and ``python -m tf_dlrm.data.synthetic`` do, then imports its tool and runs it.
"""

from __future__ import annotations

from tf_dlrm.io.early_stop import stop_rank_while_starting, stop_while_starting


def train():
    stop_rank_while_starting("tf-dlrm-train")
    from tf_dlrm.cli.main import run

    return run()


def synthetic():
    stop_while_starting("tf-dlrm-synthetic")
    from tf_dlrm.data.synthetic import run

    return run()


def transcode():
    stop_while_starting("tf-dlrm-transcode")
    from tf_dlrm.data.transcode import run

    return run()


def apply_deltas():
    stop_while_starting("tf-dlrm-apply-deltas")
    from tf_dlrm.cli.apply_deltas import run

    return run()
