"""The output of a conversion into a bucket (``--out s3://bucket/prefix``).

The same contract as :class:`~tfshards.converters.output.OutputFolder` (begin,
record, publish), for an object store, which has no rename and no lock:

- each shard is written to local temporary storage, hashed while written, and
  uploaded whole (``shard_job.write_shard``); an object appears complete or not at all;
- ``prefix/.tfshards-work/job.json`` holds the job's fingerprint, and one
  ``prefix/.tfshards-work/done/<shard>.json`` per uploaded shard its result (records,
  size, sha256, CRC-32C) and the object's version token (ETag or generation) after the
  upload;
- ``--resume`` keeps a journaled shard when its object is there with the journaled
  size and version token, and uploads only the rest;
- the manifest is uploaded last, so a prefix without ``tfshards.json`` is never a
  dataset, and the journal is removed after it;
- ``--overwrite`` removes the old manifest first (readers then see "no manifest",
  never a mix of two datasets) and the old dataset's leftover objects only after the
  new manifest is up.

Nothing stops two conversions into one prefix at the same time: run one at a time.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

from tfshards import storage
from tfshards.converters.output import result_from_json
from tfshards.converters.shard_job import ShardResult
from tfshards.errors import ManifestError, OutputError
from tfshards.schemas.format import (
    INDEX_SUFFIX,
    JOURNAL_DONE,
    JOURNAL_JOB,
    MANIFEST_NAME,
    OWN_FILE,
    TFDS_FILES,
    WORK_NAME,
    journal_entry,
)
from tfshards.schemas.manifest import Manifest
from tfshards.storage import StorageOptions
from tfshards.wording import option

log = logging.getLogger("tfshards")


class BucketOutput:
    """Hold a bucket prefix for one conversion.

    >>> with BucketOutput("s3://bucket/shards", resume=False, overwrite=False) as out:
    ...     done = out.begin(fingerprint)  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        resume: bool,
        overwrite: bool,
        storage_options: StorageOptions = None,
        cli: bool = False,
    ) -> None:
        self.path = url.rstrip("/")
        self.resume = resume
        self.overwrite = overwrite
        self.cli = cli  # the options in messages: --overwrite, or overwrite=True in Python
        self.storage_options = storage_options
        self.work = storage.join(self.path, WORK_NAME)
        self._leftovers: list[str] = []  # the old dataset's objects, removed after publish

    def __enter__(self) -> BucketOutput:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def _url(self, *names: str) -> str:
        return storage.join(self.path, *names)

    def begin(self, fingerprint: str) -> dict[str, ShardResult] | Manifest:
        """Prepare for uploading; return the shards already uploaded, or a complete manifest."""
        existing = storage.walk(self.path, self.storage_options) if self._listable() else []
        tops = sorted({name.split("/", 1)[0] for name in existing})
        if self.overwrite:
            self._retire(tops)
        elif self.resume:
            complete = self._resumable(fingerprint, tops)
            if complete is not None:
                return complete
        elif tops and all(t == WORK_NAME or OWN_FILE.match(t) for t in tops):
            if self._same_job(fingerprint):
                log.info("%s: finishing the unfinished conversion of the same inputs", self.path)
            else:
                log.info("%s: replacing the objects of an unfinished conversion", self.path)
                self._retire(tops)
        elif tops:
            raise OutputError(
                f"{storage.display(self.path)} is not empty ({len(tops)} entries, e.g. "
                f"{tops[0]}); pass {self._option('resume')} to finish an interrupted "
                f"conversion or {self._option('overwrite')} to replace it"
            )
        self._write_json(self._url(WORK_NAME, JOURNAL_JOB), {"fingerprint": fingerprint})
        return self._completed()

    def _option(self, name: str) -> str:
        return option(name, cli=self.cli)

    def _listable(self) -> bool:
        return storage.isdir(self.path, self.storage_options)

    def _retire(self, tops: list[str]) -> None:
        """The old manifest goes first; the old journal next; the old shards stay until the
        new manifest is up (then ``publish`` removes those the new dataset does not reuse)."""
        storage.remove(self._url(MANIFEST_NAME), self.storage_options)
        storage.remove(self.work, self.storage_options, recursive=True)
        self._leftovers = [t for t in tops if OWN_FILE.match(t) or t in TFDS_FILES]
        others = [
            t for t in tops if t not in self._leftovers and t not in (MANIFEST_NAME, WORK_NAME)
        ]
        if others:
            log.warning(
                "--overwrite leaves %d objects tfshards did not write in %s (e.g. %s)",
                len(others),
                storage.display(self.path),
                others[0],
            )

    def _job(self) -> dict | None:
        try:
            return json.loads(
                storage.read_bytes(self._url(WORK_NAME, JOURNAL_JOB), self.storage_options)
            )
        except FileNotFoundError:
            return None

    def _same_job(self, fingerprint: str) -> bool:
        job = self._job()
        return job is not None and job.get("fingerprint") == fingerprint

    def _resumable(self, fingerprint: str, tops: list[str]) -> Manifest | None:
        if MANIFEST_NAME in tops:
            try:
                manifest = Manifest.load(self.path, self.storage_options)
            except ManifestError as exc:
                raise OutputError(f"{exc}; pass {self._option('overwrite')} to replace it") from exc
            if manifest.source.get("fingerprint") == fingerprint:
                return manifest
            raise OutputError(
                f"{storage.display(self.path)} holds a complete conversion of other inputs or "
                f"options; pass {self._option('overwrite')} to replace it"
            )
        job = self._job()
        if job is not None and job.get("fingerprint") != fingerprint:
            raise OutputError(
                f"{storage.display(self.path)}: the inputs or options changed since the "
                "interrupted conversion (files added, removed or modified, or different "
                "options), so its shards cannot be reused; rerun with the same inputs and "
                f"options, or pass {self._option('overwrite')}"
            )
        if job is None:
            storage.remove(self.work, self.storage_options, recursive=True)
        return None

    def _completed(self) -> dict[str, ShardResult]:
        """Journaled shards whose object is there, of the journaled size and version."""
        done_root = self._url(WORK_NAME, JOURNAL_DONE)
        if not storage.isdir(done_root, self.storage_options):
            return {}
        done = {}
        for entry in storage.walk(done_root, self.storage_options):
            body = json.loads(
                storage.read_bytes(storage.join(done_root, entry), self.storage_options)
            )
            uploaded = body.pop("uploaded", None)
            result = result_from_json(body)
            try:
                found = storage.stat(self._url(result.file), self.storage_options)
            except FileNotFoundError:
                continue
            if found.size == result.bytes and uploaded in (None, found.version):
                done[result.file] = result
        return done

    def record(self, result: ShardResult) -> None:
        """Journal an uploaded shard with its object's version token, so a resume can skip it."""
        found = storage.stat(self._url(result.file), self.storage_options)
        if found.size != result.bytes:
            raise OutputError(
                f"{storage.display(self._url(result.file))}: {found.size} bytes in the bucket "
                f"after the upload, {result.bytes} written"
            )
        body = {**asdict(result), "uploaded": found.version}
        self._write_json(journal_entry(self.path, result.file), body)

    def publish(self, manifest: Manifest) -> None:
        """The manifest, then no journal, then none of the old dataset's leftover objects."""
        manifest.save(self.path, self.storage_options)
        storage.remove(self.work, self.storage_options, recursive=True)
        kept = {shard.file for split in manifest.splits.values() for shard in split.shards}
        kept |= {name + INDEX_SUFFIX for name in kept}
        kept |= {s.record_table.file for s in manifest.splits.values() if s.record_table}
        for name in self._leftovers:
            if name not in kept:  # old TFDS files too: export-tfds writes new ones after
                storage.remove(self._url(name), self.storage_options)

    def _write_json(self, url: str, body: dict) -> None:
        storage.write_bytes(url, json.dumps(body).encode(), self.storage_options)
