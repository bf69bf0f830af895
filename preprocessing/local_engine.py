"""The local engine: all cores of one machine, memory bounded by the task window and the vocabulary.

Three passes over the inputs, each a stream of tasks (groups of blocks, see
:mod:`preprocessing.input_blocks`):

0. plan: cut every file into blocks and count each block's lines, so every row has a file and line
   number (plain files: workers read their byte ranges in parallel; gzip files: one worker per file);
1. count: workers parse the training rows and count values in their own accumulator; each
   returns one table at the end, merged here;
2. transform: workers parse every block, map ids and return finished arrays; this process writes
   them in input order.

At most ``2 * workers + 2`` tasks are in flight, so memory does not grow with the input. Gzip files
cannot be split: this process decompresses them and sends the block bytes to the workers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import gc
import multiprocessing
import signal
import os
from typing import Callable, Sequence

import numpy as np

from preprocessing import input_blocks
from preprocessing.bad_rows import BadRowTally, merge_tallies, strict_error
from preprocessing.criteo_format import InputFormat, ParsedBlock, detect_format, parse_block
from preprocessing.input_blocks import Block
from preprocessing.splits import TRAIN, InputFile, SplitPlan
from preprocessing.vocabulary import CountAccumulator, CountTable, Vocabulary
from tf_dlrm.io import stop_signals

DEFAULT_BLOCK_BYTES = 1 << 20  # small, so that a block's numpy temporaries fit a CPU's L2 cache
COUNT_TASK_BYTES = 32 << 20
TRANSFORM_TASK_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class _Task:
    blocks: tuple[Block, ...]
    paths: tuple[str, ...]
    formats: tuple[InputFormat, ...]
    plan: SplitPlan
    data: tuple[bytes, ...] | None  # block bytes for gzip files, None to read from disk
    strict: bool = False

    def parsed_blocks(self):
        """``(block, parsed, 1-based line number of its first data line)`` for each block."""
        for position, block in enumerate(self.blocks):
            if self.data is not None:
                data = self.data[position]
            else:
                data = input_blocks.read_plain_block(self.paths[block.file_index], block.offset, block.length)
            input_format = self.formats[block.file_index]
            yield block, parse_block(data, input_format), block.first_data_line + (2 if input_format.header else 1)


def transform_blocks(
    blocks: Sequence[tuple[ParsedBlock, int, int]], plan: SplitPlan, vocabulary: Vocabulary, dtypes
) -> dict[int, tuple[np.ndarray, np.ndarray, list[np.ndarray]]]:
    """Finished arrays of consecutive parsed blocks, per split index: ``(label, numerical f16, ids)``.

    Args:
        blocks: ``(parsed block, file index, first data line)`` in input order.

    Shared by both engines; the ids of all blocks are looked up at once (fewer, longer numpy calls).
    """
    split = np.concatenate(
        [plan.split_of(index, first, parsed.num_lines)[parsed.valid] for parsed, index, first in blocks]
    )
    label = np.concatenate([parsed.label for parsed, _, _ in blocks])
    numerical = np.concatenate([parsed.numerical() for parsed, _, _ in blocks])
    ids = vocabulary.lookup(np.concatenate([parsed.categorical for parsed, _, _ in blocks]), dtypes)
    result = {}
    for code in range(len(plan.names)):
        chosen = split == code
        if chosen.all():
            result[code] = (label, numerical, ids)
        elif chosen.any():
            result[code] = (label[chosen], numerical[chosen], [column[chosen] for column in ids])
    return result


# ----------------------------------------------------------------------------- in the workers

try:  # loaded here, not in a forked worker: dlopen after fork could wait on a lock another thread held
    _LIBC = ctypes.CDLL("libc.so.6")
except OSError:
    _LIBC = None
_COUNTS: CountAccumulator | None = None
_FLUSH_BARRIER = None
_VOCABULARY: Vocabulary | None = None
_DTYPES: list[np.dtype] | None = None


def _start_worker() -> None:
    """Every worker's start: it ends with its parent (SIGTERM when the parent dies, even by SIGKILL, so
    no worker is left waiting for tasks), dies at once on SIGTERM, and leaves Ctrl-C to the parent
    (which stops the pass and its workers)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the prctl: nothing will signal this worker
            os._exit(0)
    _tune_malloc()


def _tune_malloc() -> None:
    """Keep freed block-sized buffers in the heap instead of returning them to the OS.

    Every block allocates and frees the same few MiB of numpy temporaries; with glibc's default
    trim and mmap thresholds each round trip to the kernel costs page faults, which took about as
    much CPU as the parsing itself. No effect outside glibc.
    """
    try:
        _LIBC.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
        _LIBC.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    except AttributeError:  # no glibc
        pass


def _start_count_worker(barrier) -> None:
    global _COUNTS, _FLUSH_BARRIER
    _start_worker()
    _COUNTS, _FLUSH_BARRIER = CountAccumulator(), barrier


def _count_task(task: _Task) -> tuple[int, BadRowTally]:
    """Pass 1: counts the training rows of a task into this worker's accumulator.

    Returns the number of training rows and, when strict, their bad rows. Counts stay in the worker
    until :func:`_flush_counts`, so this process merges one table per worker, not one per task.
    """
    rows, tally = 0, BadRowTally()
    train = task.plan.names.index(TRAIN)
    for block, parsed, first_line in task.parsed_blocks():
        in_train = task.plan.split_of(block.file_index, block.first_data_line, parsed.num_lines) == train
        if task.strict:
            tally.add_block(parsed, block.file_index, first_line, rows=in_train)
        chosen = in_train[parsed.valid]
        rows += int(chosen.sum())
        _COUNTS.add_values(parsed.categorical[chosen])
    return rows, tally


def _flush_counts() -> CountTable:
    """Returns this worker's counts; the barrier makes every worker take exactly one flush."""
    _FLUSH_BARRIER.wait()
    return _COUNTS.result()


def _start_transform_worker(vocabulary: Vocabulary, dtypes: list[np.dtype]) -> None:
    global _VOCABULARY, _DTYPES
    _start_worker()
    _VOCABULARY, _DTYPES = vocabulary, dtypes


def _transform_task(task: _Task) -> tuple[dict, BadRowTally]:
    tally, blocks = BadRowTally(), []
    for block, parsed, first_line in task.parsed_blocks():
        tally.add_block(parsed, block.file_index, first_line)
        blocks.append((parsed, block.file_index, block.first_data_line))
    return transform_blocks(blocks, task.plan, _VOCABULARY, _DTYPES), tally


# ----------------------------------------------------------------------------- the engine


WORKER_EXIT_SECONDS = 5.0


def _abandon(executor: concurrent.futures.ProcessPoolExecutor) -> None:
    """Ends a failed or interrupted pass's pool without ever waiting on it.

    The workers are ended at once (one may wait at the flush barrier for tasks that will never come).
    Waiting for the pool itself could last forever: the pool's feeder thread may be blocked writing a
    task into the full pipe that only the workers read, and both ``shutdown(wait=True)`` and the
    pool's own clean-up after its workers died join that thread. Closing this process's read end of
    the pipe, once no worker holds one, makes that write fail, so the thread (and the pool's manager
    thread, which the interpreter joins at exit) can finish.
    """
    processes = list((getattr(executor, "_processes", None) or {}).values())
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(WORKER_EXIT_SECONDS)
        if process.is_alive():  # SIGTERM is not blocked in the workers; a kill is the last resort
            process.kill()
            process.join(WORKER_EXIT_SECONDS)
    call_queue = getattr(executor, "_call_queue", None)
    if call_queue is not None and not any(process.is_alive() for process in processes):
        call_queue.cancel_join_thread()
        with contextlib.suppress(OSError):
            call_queue._reader.close()
    executor.shutdown(wait=False, cancel_futures=True)


class LocalEngine:
    """Preprocesses on this machine with ``num_workers`` processes (0: all cores available)."""

    def __init__(self, num_workers: int = 0, block_bytes: int = DEFAULT_BLOCK_BYTES):
        if num_workers < 0:
            raise ValueError(f"--num_workers must be >= 0 (0: all cores). Received: num_workers={num_workers}")
        self.num_workers = num_workers or len(os.sched_getaffinity(0))
        self.block_bytes = block_bytes
        self._blocks: list[list[Block]] = []
        # fork: workers start in milliseconds and inherit the vocabulary without pickling it, and a
        # caller's script needs no `if __name__ == "__main__"` guard. Workers run numpy code only.
        self._context = multiprocessing.get_context("fork")

    def close(self, failed: bool = False) -> None:
        """Nothing to release: worker pools live only during a pass (and are ended when one fails)."""
        del failed

    @contextlib.contextmanager
    def _executor(self, initializer=_start_worker, initargs=()):
        """A pool of forked workers for one pass.

        A forked worker has one thread; a TensorFlow object of the caller's (a tf.data iterator of
        an earlier evaluation, say) that the worker's garbage collector destroyed would wait forever
        for threads the fork did not copy (seen: a test process hung in ``~IteratorResource``). The
        caller's garbage is collected here, where its threads run, and what is left is frozen, out
        of the workers' collections, until the pass ends."""
        gc.collect()
        gc.freeze()
        try:
            executor = concurrent.futures.ProcessPoolExecutor(
                self.num_workers, mp_context=self._context, initializer=initializer, initargs=initargs)
            try:
                yield executor
            except BaseException:
                _abandon(executor)
                raise
            executor.shutdown(wait=True)
        finally:
            gc.unfreeze()

    def _run_ordered(self, executor, function: Callable, tasks, on_result: Callable) -> None:
        """Runs tasks with a bounded window, handing results over in submission order."""
        window = 2 * self.num_workers + 2
        pending: collections.deque = collections.deque()
        try:
            for task in tasks:
                pending.append(executor.submit(function, task))
                if len(pending) >= window:
                    on_result(pending.popleft().result())
                    stop_signals.check()  # a stop signal whose exception a finalizer dropped
            while pending:
                on_result(pending.popleft().result())
                stop_signals.check()
        except BaseException:
            for future in pending:
                future.cancel()
            raise

    def describe(self, paths: Sequence[str]) -> list[InputFile]:
        """Detects each file's format and counts its lines (pass 0)."""
        formats = []
        for path in paths:
            compressed = path.endswith(".gz")
            input_blocks.check_compression(path, compressed)
            formats.append((compressed, detect_format(path, input_blocks.read_first_lines(path, compressed))))
        self._blocks, files = [], []
        with self._executor() as executor:
            jobs = []
            for path, (compressed, input_format) in zip(paths, formats):
                if compressed:
                    jobs.append((None, [executor.submit(input_blocks.gzip_line_counts, path, input_format.header, self.block_bytes)]))
                else:
                    ranges = input_blocks.plain_block_ranges(path, input_format.header, self.block_bytes)
                    parts = [ranges[i : i + 64] for i in range(0, len(ranges), 64)]
                    jobs.append((ranges, [executor.submit(input_blocks.plain_line_counts, path, part) for part in parts]))
            for index, (path, (compressed, input_format), (ranges, futures)) in enumerate(zip(paths, formats, jobs)):
                counts = [count for future in futures for count in future.result()]
                ranges = ranges or [(0, 0)] * len(counts)
                blocks, line = [], 0
                for block_index, ((offset, length), count) in enumerate(zip(ranges, counts)):
                    blocks.append(Block(index, block_index, offset, length, line, count))
                    line += count
                self._blocks.append(blocks)
                files.append(InputFile(index, path, compressed, input_format, line))
        return files

    def _tasks(self, files: Sequence[InputFile], plan: SplitPlan, strict: bool, task_bytes: int, only: str | None):
        """Tasks in input order, each up to ``task_bytes`` of one file's blocks (only those touching ``only``)."""
        paths = tuple(f.path for f in files)
        formats = tuple(f.input_format for f in files)
        for f in files:
            if only is not None and not plan.overlaps(f.index, 0, f.data_lines, only):
                continue
            stream = input_blocks.iter_gzip_blocks(f.path, f.input_format.header, self.block_bytes) if f.compressed else None
            batch, batch_data, size = [], [], 0
            for block in self._blocks[f.index]:
                data = next(stream) if stream is not None else None
                if only is not None and not plan.overlaps(f.index, block.first_data_line, block.num_lines, only):
                    continue
                batch.append(block)
                batch_data.append(data)
                size += len(data) if data is not None else block.length
                if size >= task_bytes:
                    yield _Task(tuple(batch), paths, formats, plan, tuple(batch_data) if f.compressed else None, strict)
                    batch, batch_data, size = [], [], 0
            if batch:
                yield _Task(tuple(batch), paths, formats, plan, tuple(batch_data) if f.compressed else None, strict)

    def count(
        self, files: Sequence[InputFile], plan: SplitPlan, strict: bool, frequency_threshold: int
    ) -> tuple[CountTable, int]:
        """Pass 1: counts over the training rows; returns ``(counts of kept values, training rows)``."""
        rows = 0
        paths = [f.path for f in files]

        def on_result(result):
            nonlocal rows
            task_rows, tally = result
            if strict and tally.total:
                raise strict_error(tally.earliest(), paths)
            rows += task_rows

        barrier = self._context.Barrier(self.num_workers)
        with self._executor(_start_count_worker, (barrier,)) as executor:
            tasks = self._tasks(files, plan, strict, COUNT_TASK_BYTES, only=TRAIN)
            self._run_ordered(executor, _count_task, tasks, on_result)
            flushes = [executor.submit(_flush_counts) for _ in range(self.num_workers)]
            tables = [flush.result() for flush in flushes]
        return CountTable.merge(tables).kept(frequency_threshold), rows

    def transform(
        self,
        files: Sequence[InputFile],
        plan: SplitPlan,
        vocabulary: Vocabulary,
        dtypes,
        sink: Callable,
        strict: bool,
        workspace: str,
    ) -> BadRowTally:
        """Pass 2: every row through the transform; ``sink(split, label, numerical, ids)`` in input order."""
        tallies = []
        paths = [f.path for f in files]

        def on_result(result):
            arrays, tally = result
            if strict and tally.total:
                raise strict_error(tally.earliest(), paths)
            for code, (label, numerical, ids) in arrays.items():
                sink(plan.names[code], label, numerical, ids)
            if tally.total:
                tallies.append(tally)

        vocabulary.prepare()  # build the lookup tables once, before the workers fork and share them
        with self._executor(_start_transform_worker, (vocabulary, list(dtypes))) as executor:
            tasks = self._tasks(files, plan, strict, TRANSFORM_TASK_BYTES, only=None)
            self._run_ordered(executor, _transform_task, tasks, on_result)
        return merge_tallies(tallies)
