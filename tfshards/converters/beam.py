"""Conversion on Apache Beam: the same plan, the same shard writer, run by Beam workers.

Pairing, validation of the pairing, split assignment, the key shuffle and the shard
plan run once, on the machine that launches the job: they need only the list of
file names. Each planned shard then becomes one Beam element, and a worker decodes,
validates, encodes and writes it with the same code as the local converter, so the
shards and the manifest are byte-identical to a local conversion of the same inputs.

    tfshards convert --images data/images --masks data/masks --out /shared/shards \\
        --runner beam --beam-option=--runner=DirectRunner --beam-option=--direct_num_workers=2

Workers read the inputs and write shards and their journal entries by path or URL
through :mod:`tfshards.storage`: with ``--images gs://...`` and ``--out gs://...`` a
Dataflow job needs no FUSE mount (each worker writes a shard to its local disk,
hashes it and uploads it whole). With local paths every worker must see the same
folders (a local disk for DirectRunner; a shared file system on a cluster).
Storage options (``--storage-option``) travel with the pipeline to the workers; on
Dataflow prefer the workers' service account to keys in options.

Inside a user's own pipeline, apply :class:`WriteShards` to a PCollection of
``tfshards.converters.planning.ShardSpec``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from tfshards import storage
from tfshards.converters.options import ConvertOptions
from tfshards.converters.output import result_from_json
from tfshards.converters.planning import ShardSpec
from tfshards.converters.shard_job import ShardResult, write_shard
from tfshards.errors import OptionsError
from tfshards.schemas.format import journal_entry
from tfshards.storage import Location, StorageOptions

try:
    import apache_beam as beam
except ImportError:  # the 'beam' extra is optional
    beam = None


def _require_beam() -> None:
    if beam is None:
        raise OptionsError('the Beam runner needs Apache Beam: pip install "tfshards[beam]"')


def _write_one(
    spec: ShardSpec,
    options: ConvertOptions,
    channels: int,
    out: str,
    storage_options: StorageOptions = None,
) -> str:
    """Write one shard and its journal entry; return the shard's file name."""
    target = out if storage.is_url(out) else Path(out)
    result = write_shard(spec, options, channels, target, None, storage_options)
    entry = journal_entry(target, result.file)
    if not storage.is_url(out):
        entry.parent.mkdir(parents=True, exist_ok=True)
    storage.write_bytes(entry, json.dumps(asdict(result)).encode(), storage_options)
    return result.file


if beam is not None:

    class WriteShards(beam.PTransform):
        """PCollection[ShardSpec] -> PCollection[str]: shard files written into ``out``."""

        def __init__(
            self,
            options: ConvertOptions,
            channels: int,
            out: str,
            storage_options: StorageOptions = None,
        ) -> None:
            super().__init__()
            self.options, self.channels, self.out = options, channels, out
            self.storage_options = storage_options

        def expand(self, specs):
            return (
                specs
                | "Spread shards over workers" >> beam.Reshuffle()
                | "Decode, validate, encode, write"
                >> beam.Map(_write_one, self.options, self.channels, self.out, self.storage_options)
            )


def beam_runner(beam_args: str | list[str] | None = None):
    """A ``runner`` for ``convert(...)`` that writes the shards with a Beam pipeline."""
    _require_beam()
    from apache_beam.options.pipeline_options import PipelineOptions

    args = shlex.split(beam_args) if isinstance(beam_args, str) else list(beam_args or [])

    def run(
        specs: list[ShardSpec],
        options: ConvertOptions,
        channels: int,
        out: Location,
        storage_options: StorageOptions = None,
    ) -> Iterable[ShardResult]:
        if specs:
            with beam.Pipeline(options=PipelineOptions(args)) as pipeline:
                _ = (
                    pipeline
                    | "Planned shards" >> beam.Create(specs)
                    | WriteShards(options, channels, str(out), storage_options)
                )
        for spec in specs:
            entry = journal_entry(out, spec.file_name)
            yield result_from_json(json.loads(storage.read_bytes(entry, storage_options)))

    return run
