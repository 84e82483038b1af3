"""Conversion on Apache Beam: the same plan, the same shard writer, run by Beam workers.

Pairing, validation of the pairing, split assignment, the key shuffle and the shard
plan run once, on the machine that launches the job: they need only the list of
file names. Each planned shard then becomes one Beam element, and a worker decodes,
validates, encodes and writes it with the same code as the local converter, so the
shards and the manifest are byte-identical to a local conversion of the same inputs.

    tfshards convert --images data/images --masks data/masks --out /shared/shards \\
        --runner beam --beam-option=--runner=DirectRunner --beam-option=--direct_num_workers=2

Workers write shards and their journal entries straight into ``--out``, so every
worker must see the input folders and the output folder at the same paths (a local
disk for DirectRunner; a shared file system such as NFS or GCS FUSE on a cluster).

Inside a user's own pipeline, apply :class:`WriteShards` to a PCollection of
``tfshards.converters.planning.ShardSpec``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from tfshards.converters.options import ConvertOptions
from tfshards.converters.output import result_from_json, write_json_atomic
from tfshards.converters.planning import ShardSpec
from tfshards.converters.shard_job import ShardResult, write_shard
from tfshards.errors import OptionsError
from tfshards.schemas.format import journal_entry

try:
    import apache_beam as beam
except ImportError:  # the 'beam' extra is optional
    beam = None


def _require_beam() -> None:
    if beam is None:
        raise OptionsError('the Beam runner needs Apache Beam: pip install "tfshards[beam]"')


def _write_one(spec: ShardSpec, options: ConvertOptions, channels: int, out: str) -> str:
    """Write one shard and its journal entry; return the shard's file name."""
    result = write_shard(spec, options, channels, Path(out))
    write_json_atomic(journal_entry(Path(out), result.file), asdict(result))
    return result.file


if beam is not None:

    class WriteShards(beam.PTransform):
        """PCollection[ShardSpec] -> PCollection[str]: shard files written into ``out``."""

        def __init__(self, options: ConvertOptions, channels: int, out: str) -> None:
            super().__init__()
            self.options, self.channels, self.out = options, channels, out

        def expand(self, specs):
            return (
                specs
                | "Spread shards over workers" >> beam.Reshuffle()
                | "Decode, validate, encode, write"
                >> beam.Map(_write_one, self.options, self.channels, self.out)
            )


def beam_runner(beam_args: str | list[str] | None = None):
    """A ``runner`` for ``convert(...)`` that writes the shards with a Beam pipeline."""
    _require_beam()
    from apache_beam.options.pipeline_options import PipelineOptions

    args = shlex.split(beam_args) if isinstance(beam_args, str) else list(beam_args or [])

    def run(
        specs: list[ShardSpec], options: ConvertOptions, channels: int, out: Path
    ) -> Iterable[ShardResult]:
        if specs:
            with beam.Pipeline(options=PipelineOptions(args)) as pipeline:
                _ = (
                    pipeline
                    | "Planned shards" >> beam.Create(specs)
                    | WriteShards(options, channels, str(out))
                )
        for spec in specs:
            entry = journal_entry(Path(out), spec.file_name)
            yield result_from_json(json.loads(entry.read_text()))

    return run
