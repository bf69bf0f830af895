"""``tf-dlrm-preprocess-criteo``, the console script of :mod:`preprocessing.criteo`: answers a stop signal before the
tool's imports, as ``python -m preprocessing.criteo`` does (see :mod:`tf_dlrm.cli.console`)."""

from __future__ import annotations

from tf_dlrm.io.early_stop import stop_while_starting


def criteo():
    stop_while_starting("tf-dlrm-preprocess-criteo")
    from preprocessing.criteo import run

    return run()
