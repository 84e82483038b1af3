"""The output folder of a conversion: a lock, a resume journal, overwrite and publish.

While a conversion runs the folder holds::

    .tfshards.lock          flock()ed by the running convert (released even on kill -9)
    .tfshards-work/job.json the job's fingerprint (inputs and options)
    .tfshards-work/done/    one JSON per completed shard (its record count, hash...)
    .<shard>.tmp            a shard being written

The manifest is written last and the work folder removed after it, so a
folder without ``tfshards.json`` is never mistaken for a complete dataset.
The lock file is removed when the conversion ends, whether it finished, failed
or was refused.

``--overwrite`` of a complete dataset builds the new one beside it, in
``.tfshards-work/next/`` (a folder of its own with the layout above), and
replaces the old one only when the new one is complete: the old manifest is
removed first, so no reader sees a mix; until then the old dataset stays
readable, and a failed run leaves it as it was (rerunning finishes the new one).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path

from tfshards import storage
from tfshards.converters.shard_job import ShardResult
from tfshards.errors import OutputError
from tfshards.schemas.format import (
    JOURNAL_DONE,
    JOURNAL_JOB,
    LOCK_NAME,
    MANIFEST_NAME,
    NEXT_NAME,
    OWN_FILE,
    TFDS_FILES,
    TMP_SUFFIX,
    WORK_NAME,
    journal_entry,
    temporary_path,
)
from tfshards.schemas.manifest import Manifest, SkippedPair
from tfshards.wording import option

log = logging.getLogger("tfshards")


class OutputFolder:
    """Hold the output folder for one conversion.

    >>> with OutputFolder(Path("shards"), resume=False, overwrite=False) as folder:
    ...     done = folder.begin(fingerprint)  # doctest: +SKIP
    """

    def __init__(self, path: Path, *, resume: bool, overwrite: bool, cli: bool = False) -> None:
        self.path = Path(path)
        self.resume = resume
        self.overwrite = overwrite
        self.cli = cli  # the options in messages: --overwrite, or overwrite=True in Python
        self.work = self.path / WORK_NAME
        self._lock_file = None

    def __enter__(self) -> OutputFolder:
        self.path.mkdir(parents=True, exist_ok=True)
        lock_path = self.path / LOCK_NAME
        while True:
            handle = open(lock_path, "a+")  # noqa: SIM115 - closed in __exit__
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                raise OutputError(
                    f"{self.path}: another tfshards convert is writing to this folder; "
                    "wait for it to finish"
                ) from None
            # The holder we waited for may have removed the file: lock the one on disk.
            if _same_file(handle, lock_path):
                self._lock_file = handle
                return self
            handle.close()

    def __exit__(self, *exc_info: object) -> None:
        # Removed while still held, so nobody can lock a file that is about to vanish.
        (self.path / LOCK_NAME).unlink(missing_ok=True)
        fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        self._lock_file.close()

    @property
    def replacing(self) -> bool:
        """--overwrite of a complete dataset: the new one is built beside it first."""
        return self.overwrite and (self.path / MANIFEST_NAME).is_file()

    @property
    def staging(self) -> Path:
        return self.work / NEXT_NAME

    def begin(self, fingerprint: str) -> dict[str, ShardResult] | Manifest:
        """Prepare for writing; return the shards already done, or a complete manifest."""
        existing = [p for p in self.path.iterdir() if p.name != LOCK_NAME]
        if self.overwrite:
            self._remove_own_files()
        elif self.resume:
            complete = self._resumable(fingerprint)
            if complete is not None:
                return complete
        elif existing and self._unfinished_only(existing):  # a failed or killed conversion
            if self._same_job(fingerprint):
                log.info("%s: finishing the unfinished conversion of the same inputs", self.path)
            else:
                log.info("%s: replacing the files of an unfinished conversion", self.path)
                self._remove_own_files()
        elif (self.path / MANIFEST_NAME).is_file():
            raise OutputError(
                f"{self.path} holds a complete dataset ({MANIFEST_NAME}); pass "
                f"{self._option('overwrite')} to replace it, or another "
                f"{self._option('out', None)} folder"
            )
        elif existing:
            raise OutputError(
                f"{self.path} is not empty ({len(existing)} entries, e.g. {existing[0].name}) "
                f"and holds no tfshards conversion; choose an empty or new "
                f"{self._option('out', None)} folder, or pass {self._option('overwrite')} to "
                "write the dataset among these files"
            )
        for stale in self.path.glob(f".*{TMP_SUFFIX}"):
            stale.unlink()
        (self.work / JOURNAL_DONE).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.work / JOURNAL_JOB, {"fingerprint": fingerprint})
        return self._completed()

    def _unfinished_only(self, entries: list[Path]) -> bool:
        """No manifest, and nothing but what a conversion writes while it runs."""
        return all(p.name == WORK_NAME or OWN_FILE.match(p.name) for p in entries)

    def _same_job(self, fingerprint: str) -> bool:
        job = self.work / JOURNAL_JOB
        return job.exists() and json.loads(job.read_text())["fingerprint"] == fingerprint

    def _resumable(self, fingerprint: str) -> Manifest | None:
        manifest_path = self.path / MANIFEST_NAME
        if manifest_path.exists():
            manifest = Manifest.load(self.path)
            if manifest.source.get("fingerprint") == fingerprint:
                return manifest
            raise OutputError(
                f"{self.path} holds a complete conversion of other inputs or options; "
                f"pass {self._option('overwrite')} to replace it"
            )
        job = self.work / JOURNAL_JOB
        if job.exists() and not self._same_job(fingerprint):
            raise OutputError(
                f"{self.path}: the inputs or options changed since the interrupted conversion "
                "(files added, removed or modified, or different options), so its shards cannot "
                "be reused; rerun with the same inputs and options, or pass "
                + self._option("overwrite")
            )
        if not job.exists():
            shutil.rmtree(self.work, ignore_errors=True)
        return None

    def _option(self, name: str, value: str | None = "True") -> str:
        return option(name, cli=self.cli, value=value)

    def _completed(self) -> dict[str, ShardResult]:
        done = {}
        for record in sorted((self.work / JOURNAL_DONE).glob("*.json")):
            result = result_from_json(json.loads(record.read_text()))
            shard = self.path / result.file
            if shard.is_file() and shard.stat().st_size == result.bytes:
                done[result.file] = _with_crc32c(result, shard)
        return done

    def record(self, result: ShardResult) -> None:
        """Journal a shard that is complete on disk, so a resume can skip it."""
        write_json_atomic(journal_entry(self.path, result.file), asdict(result))

    def publish(self, manifest: Manifest) -> None:
        """The manifest, then no work folder and no lock file: a finished folder holds only
        the shards, the manifest and the files asked for."""
        if not (self.path / MANIFEST_NAME).is_file():  # else a --resume of a complete one
            manifest.save(self.path)
        shutil.rmtree(self.work, ignore_errors=True)
        (self.path / LOCK_NAME).unlink(missing_ok=True)  # still held until __exit__

    def replace_with(self, staging: Path, manifest: Manifest) -> None:
        """Swap in the complete dataset built in ``staging``: the old manifest goes first,
        then the old shards; the new shards move in and the new manifest comes last."""
        self._remove_own_files(keep_work=True)
        for entry in sorted(staging.iterdir()):
            if OWN_FILE.match(entry.name):
                os.replace(entry, self.path / entry.name)
        self.publish(manifest)

    def _remove_own_files(self, *, keep_work: bool = False) -> None:
        # The manifest goes first: from then on the folder never claims completeness.
        (self.path / MANIFEST_NAME).unlink(missing_ok=True)
        others = []
        for entry in self.path.iterdir():
            if OWN_FILE.match(entry.name) or entry.name in TFDS_FILES:
                entry.unlink()
            elif entry.name == WORK_NAME:
                if not keep_work:
                    shutil.rmtree(entry)
            elif entry.name != LOCK_NAME:
                others.append(entry.name)
        if others:
            log.warning(
                "--overwrite left %d files tfshards did not write in %s (e.g. %s)",
                len(others),
                self.path,
                others[0],
            )


def _same_file(handle, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def write_json_atomic(path: Path, body: dict) -> None:
    """Write under a temporary name, then rename: readers never see half a file."""
    tmp = temporary_path(path)
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def _with_crc32c(result: ShardResult, shard: Path) -> ShardResult:
    """A result journaled before tfshards recorded CRC-32Cs, completed from its file (so
    a resumed conversion writes the manifest a fresh one would)."""
    if result.crc32c is not None:
        return result
    return replace(result, crc32c=storage.file_digests(shard, ["crc32c"])["crc32c"])


def result_from_json(body: dict) -> ShardResult:
    body.pop("uploaded", None)  # a bucket journal's object version (bucket_output.py)
    body["skipped"] = [SkippedPair(**item) for item in body["skipped"]]
    body["image_sizes"] = [tuple(size) for size in body["image_sizes"]]
    return ShardResult(**body)
