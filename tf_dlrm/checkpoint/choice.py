"""Which checkpoint a run may continue from, and whether its data still matches (plain files, no TF).

- :func:`newest_intact`: ``--resume`` takes the newest checkpoint whose manifest parses and whose
  files pass their size and sha256 checks; newer ones that fail are skipped with the reason and, when
  training, renamed aside (``ckpt-<step>.corrupt``, never deleted) so that the run can save that step
  again.
- :func:`data_record` / :func:`check_same_data`: a checkpoint records the global batch size, the
  training split's sample count and a fingerprint of its files; ``--resume`` refuses a different
  batch size or dataset, because the data position (``step`` batches of the seeded order) would then
  point at other samples. Continuing at the exact sample position instead is not offered.
"""

from __future__ import annotations

import hashlib
import os

from tf_dlrm.checkpoint.store import CheckpointError, list_checkpoints, read_manifest, verify_files

_EDGE_BYTES = 1 << 16  # bytes hashed at each end of every data file


def newest_intact(save_path: str, move_aside: bool) -> tuple[str | None, list[str]]:
    """The newest checkpoint under ``save_path`` that verifies, and one line per newer one skipped."""
    skipped = []
    for _, path in reversed(list_checkpoints(save_path)):
        try:
            verify_files(path, read_manifest(path))
        except CheckpointError as error:
            line = f"skipped checkpoint {path}: {error}"
            if move_aside:
                aside = f"{path}.corrupt"
                os.rename(path, aside)
                line += f"; moved it aside to {aside}"
            skipped.append(line)
            continue
        return path, skipped
    return None, skipped


def latest(save_path: str | None) -> str | None:
    """The newest published checkpoint under ``save_path`` (None when there is none or no path)."""
    found = list_checkpoints(save_path) if save_path else []
    return found[-1][1] if found else None


def _fingerprint(paths) -> str:
    """sha256 of each file's name, size and first and last 64 KiB: cheap, and changes with the data."""
    digest = hashlib.sha256()
    for path in paths:
        size = os.path.getsize(path)
        digest.update(f"{os.path.basename(path)}:{size}:".encode())
        with open(path, "rb") as handle:
            digest.update(handle.read(_EDGE_BYTES))
            handle.seek(max(0, size - _EDGE_BYTES))
            digest.update(handle.read(_EDGE_BYTES))
    return digest.hexdigest()


def data_record(reader, batch_size: int) -> dict:
    """What a training checkpoint records of its data: batch size, sample count, fingerprint."""
    files = getattr(reader, "files", None)  # synthetic in-memory batches have no files
    record = {"batch_size": int(batch_size), "train_samples": int(reader.num_samples)}
    if files is not None:
        paths = [files.label] + ([files.numerical] if files.numerical else []) + list(files.categorical)
        record["train_fingerprint"] = _fingerprint(paths)
    return record


def check_same_data(directory: str, manifest: dict, current: dict, where: str) -> None:
    """Refuses to resume from ``directory`` when its batch size or training data differ from ``current``."""
    saved = {**manifest.get("data", {})}
    saved.setdefault("batch_size", manifest.get("position", {}).get("batch_size"))
    if saved.get("batch_size") is not None and saved["batch_size"] != current["batch_size"]:
        raise CheckpointError(
            f"checkpoint {directory} was trained with --batch_size={saved['batch_size']}; the flags give "
            f"--batch_size={current['batch_size']}, with which step {manifest['step']} would point at other "
            "samples: resume with the same --batch_size, or start a new --save_checkpoint_path"
        )
    for key, what in (("train_samples", "samples"), ("train_fingerprint", "file fingerprint")):
        if key in saved and key in current and saved[key] != current[key]:
            raise CheckpointError(
                f"checkpoint {directory} was trained on a different training split ({what} {saved[key]}) than "
                f"{where} ({current[key]}): resume on the same dataset, or start a new --save_checkpoint_path"
            )
