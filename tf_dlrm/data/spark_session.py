"""The Spark session of a tool's Spark engine (``preprocessing.criteo --engine=spark``, ``transcode --engine=spark``):
started on the driver, and ended in bounded time however the tool ends.

A stop signal (:mod:`tf_dlrm.io.stop_signals`) usually lands while the driver waits inside a py4j call for a job;
the exception it raises leaves that call's answer unread on the gateway connection, so the next call (a polite
``SparkSession.stop()``) fails or hangs. A stopped or failed engine therefore ends its JVM instead: SIGTERM (its
shutdown hooks stop the context and remove Spark's scratch directories), SIGKILL if that does not end it. A local
master's scratch files (``spark.local.dir``, unless the user chose one) go to a directory this process removes when it
ends; then the JVM is killed at once, its shutdown hooks having nothing to clean. The executors' Python workers are the
JVM's descendants and are ended with it.

Driver only: executors never import this module (nothing here is shipped to them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import zipfile

from tf_dlrm.io import stop_signals

JVM_EXIT_SECONDS = 1.0  # SIGTERM's grace where Spark's shutdown hooks must clean the user's scratch directory


def require_pyspark(install: str) -> None:
    """Raises ImportError naming how to install PySpark (``install``) when it is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError as error:
        raise ImportError(f"--engine=spark needs PySpark: install it with {install}") from error


def start_session(master: str, app_name: str, conf: dict | None = None):
    """A SparkSession whose Python workers use this interpreter (unless PYSPARK_PYTHON is set).

    The caller's SIGINT handler stays in place: a new SparkContext replaces it with one that cancels the jobs and
    raises KeyboardInterrupt, which would pass by a tool's clean stop (one line, exit 130, the temporary output
    removed); an engine that is stopped ends its JVM anyway (:func:`end_session`).

    Raises:
        RuntimeError: Spark cannot start (no Java, an unreachable master), naming ``--spark_master``.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # py4j logs a traceback for each call the JVM's end cuts, and a stop signal sent to the process group (Ctrl-C)
    # may end the JVM before this process runs its handler; every such failure is also raised to the tool, which
    # names it in one line.
    for name in ("py4j", "py4j.java_gateway", "py4j.clientserver"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    builder = SparkSession.builder.master(master).appName(app_name).config("spark.ui.enabled", "false")
    conf = dict(conf or {})
    own_scratch = master.startswith("local") and _scratch_in_own_directory(conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main_thread else None
    try:
        session = builder.getOrCreate()
    except Exception as error:  # py4j/PySpark raise their own types; the cause is kept
        raise RuntimeError(
            f"Cannot start Spark with --spark_master={master} (needs Java 17 and a reachable master): {error}"
        ) from error
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    session.sparkContext.setLogLevel("WARN")
    # Nothing of the JVM's needs its shutdown hooks then: end_session may kill it at once, and so may a stop signal,
    # before pyspark's own calls on the way out (SCCallSiteSync's exit) wait on the connection the signal cut.
    session._tf_dlrm_own_scratch = own_scratch
    if own_scratch:
        stop_signals.on_stop(_end_at_stop)
    return session


def _end_at_stop() -> None:
    """A stop signal's first act: the JVM killed."""
    _end_jvm(grace_s=0.0)


def _scratch_in_own_directory(conf: dict) -> bool:
    """Points a local JVM's scratch files (``spark.local.dir``, and ``java.io.tmpdir`` where Spark keeps a
    ``spark-*`` directory of its own) at a directory removed when this process ends, unless the user chose.
    Returns whether it did."""
    if "spark.local.dir" in conf or os.environ.get("SPARK_LOCAL_DIRS") or "spark.driver.extraJavaOptions" in conf:
        return False
    directory = tempfile.mkdtemp(prefix="tf_dlrm_spark_scratch_")
    stop_signals.remove_when_ending(directory)
    conf["spark.local.dir"] = directory
    conf["spark.driver.extraJavaOptions"] = f"-Djava.io.tmpdir={directory}"
    return True


def end_session(session, failed: bool) -> None:
    """Stops ``session``: politely after a success, by ending its JVM after a failure or a stop signal (or when the
    polite stop itself fails), so a tool never waits on a gateway connection cut in the middle of a call."""
    if not failed:
        try:
            session.stop()
            return
        except Exception:  # the connection is unusable: end the JVM below
            pass
    _end_jvm(grace_s=0.0 if getattr(session, "_tf_dlrm_own_scratch", False) else JVM_EXIT_SECONDS)


def _end_jvm(grace_s: float) -> None:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    context = SparkContext._active_spark_context
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:  # its connection from the JVM ends with the JVM: no error to print
        server.handle_error = lambda request, address: None
    process = getattr(SparkContext._gateway, "proc", None)  # set by pyspark's launch_gateway
    if process is not None and process.poll() is None:
        # The executors' Python workers finish their task before they notice the JVM is gone: they are ended too.
        workers = stop_signals.descendants(process.pid)
        if grace_s > 0:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace_s)
        stop_signals.kill_all([process.pid, *workers])
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(JVM_EXIT_SECONDS)
    with contextlib.suppress(Exception):
        SparkContext._gateway.close()
    # The JVM is gone: forget it, so a later session in this process starts a new one.
    SparkContext._active_spark_context = None
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


def ship_zip(context, name: str, entries: dict[str, str | bytes]) -> None:
    """Ships Python modules to the executors as one zip ``name`` (``entries``: path in the zip -> file to read, or
    the bytes to write).

    The zip must outlive the context (Spark serves added files from their original path to executors that start
    later), so its directory is removed when this process ends, by a stop signal too.
    """
    directory = tempfile.mkdtemp(prefix="tf_dlrm_spark_code_")
    stop_signals.remove_when_ending(directory)
    archive = os.path.join(directory, name)
    with zipfile.ZipFile(archive, "w") as bundle:
        for inside, source in entries.items():
            if isinstance(source, bytes):
                bundle.writestr(inside, source)
            else:
                bundle.write(source, inside)
    context.addPyFile(archive)
