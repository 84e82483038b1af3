"""The `tfshards` command: argparse subcommands. Results go to stdout, errors to stderr.

Exit codes: 0 success, 1 the job failed, 2 bad usage. The subcommands live in
``make.py`` (synth, convert, demo), ``datasets.py`` (verify, inspect, records,
export-tfds, cache) and ``bench.py`` (bench).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import importlib.metadata
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence

from tfshards.cli.bench import add_bench
from tfshards.cli.datasets import (
    add_cache,
    add_export_tfds,
    add_inspect,
    add_records,
    add_verify,
)
from tfshards.cli.make import add_convert, add_demo, add_synth
from tfshards.errors import OptionsError, TfshardsError


def quiet_tensorflow(*, verbose: bool) -> None:
    """TensorFlow's C++ log lines (absl, oneDNN, CPU features) only with -v.

    Set before TensorFlow is imported (every subcommand imports it lazily); a level the
    user set in TF_CPP_MIN_LOG_LEVEL is kept. TensorFlow's Python warnings go through
    ``logging`` and show with -v.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.ERROR)


def configure_logging(*, verbose: bool, quiet: bool) -> None:
    """tfshards' own INFO lines by default (WARNING with -q); everything at DEBUG with -v.

    Other libraries' loggers (botocore, s3fs, fsspec...) stay at WARNING unless -v: their
    INFO lines ("Found credentials in environment variables.") would otherwise print under
    tfshards' name and break into the progress bar. Their warnings keep their own name.
    Like ``logging.basicConfig``, nothing changes where the root logger has handlers.
    """
    root = logging.getLogger()
    if root.handlers:  # configured by the caller (an application, pytest): left alone
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_NamedFormatter())
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    own = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.getLogger("tfshards").setLevel(own)


class _NamedFormatter(logging.Formatter):
    """``tfshards: INFO: ...`` for tfshards' records, ``botocore: WARNING: ...`` for others'."""

    def format(self, record: logging.LogRecord) -> str:
        source = record.name.split(".", 1)[0] if record.name != "root" else "tfshards"
        return f"{source}: {record.levelname}: {record.getMessage()}" + (
            "\n" + self.formatException(record.exc_info) if record.exc_info else ""
        )


def import_tensorflow(*, verbose: bool) -> None:
    """Import TensorFlow and find its devices with native stderr sent to ``logging`` (debug).

    Some builds log through absl before any level applies (CUDA stubs on a machine
    without a GPU, cuInit), which no environment variable silences.
    """
    if verbose or "tensorflow" in sys.modules:
        return
    with _native_stderr_logged():
        import tensorflow as tf

        tf.config.list_physical_devices()  # device discovery logs here


@contextlib.contextmanager
def _native_stderr_logged():
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                logging.getLogger("tfshards").debug("tensorflow: %s", line)


def _needs_tensorflow() -> str:
    """What to do where TensorFlow is missing (an install without dependencies, for Pairs):
    the requirement this install of tfshards declares."""
    try:
        declared = importlib.metadata.requires("tfshards") or []
    except importlib.metadata.PackageNotFoundError:  # a clone on PYTHONPATH
        declared = []
    wanted = next((r.split(";")[0].strip() for r in declared if re.match(r"tensorflow\b", r)), "")
    return (
        "this command needs TensorFlow, which is not installed here; install it with: "
        f'{sys.executable} -m pip install "{wanted or "tensorflow"}"'
    )


def _end_progress_bars() -> None:
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        # A Ctrl-C inside tqdm's constructor leaves an instance without its position:
        # closing it would raise AttributeError over the interrupt's message (seen in CI).
        if hasattr(bar, "pos"):
            bar.close()


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: words it does not know are its error, with its usage and the
    nearest option it has (argparse hands them up to ``tfshards``' own parser, whose usage
    names no option of the subcommand)."""

    def __init__(self, *, outer: argparse.ArgumentParser, **kwargs) -> None:
        super().__init__(**kwargs)
        self.outer = outer

    def parse_known_args(self, args=None, namespace=None):
        namespace, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}{self._hint(unknown)}")
        return namespace, unknown

    def _hint(self, unknown: list[str]) -> str:
        flags = [word.split("=", 1)[0] for word in unknown if word.startswith("-")]
        outer = [flag for flag in flags if flag in self.outer._option_string_actions]
        if outer:
            first = " ".join(outer)
            command = self.prog.rsplit(" ", 1)[-1]
            return f"; put {first} first: {self.outer.prog} {first} {command} ..."
        options = [o for o in self._option_string_actions if o.startswith("--")]
        near = [match for flag in flags for match in difflib.get_close_matches(flag, options, 1)]
        return f"; did you mean {' and '.join(near)}?" if near else ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfshards",
        allow_abbrev=False,
        description="Convert image/mask folders into pre-shuffled TFRecord shards and stream "
        "them into Keras training.",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars or info logs")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        parser_class=functools.partial(_CommandParser, outer=parser),
    )
    for add in SUBCOMMANDS:
        add(sub)
    for subcommand in sub.choices.values():  # a typo such as --binary-mask is an error
        subcommand.allow_abbrev = False
    return parser


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    add_synth,
    add_convert,
    add_demo,
    add_verify,
    add_inspect,
    add_records,
    add_export_tfds,
    add_cache,
    add_bench,
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(verbose=args.verbose, quiet=args.quiet)
    quiet_tensorflow(verbose=args.verbose)
    try:
        if getattr(args, "tensorflow", False):
            import_tensorflow(verbose=args.verbose)
        return args.run(args)
    except ModuleNotFoundError as exc:
        if exc.name != "tensorflow":  # a broken install keeps its traceback
            raise
        print(f"tfshards {args.command}: error: {_needs_tensorflow()}", file=sys.stderr)
        return 1
    except OptionsError as exc:
        print(f"tfshards {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except TfshardsError as exc:
        print(f"tfshards {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # disk full, permissions, a vanished file...
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"tfshards {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _end_progress_bars()
        hint = getattr(args, "interrupt_hint", None)
        # "\r": a bar that the interrupt stopped mid-write has no instance left to close,
        # and its fragment must not lead the message's line.
        print(
            "\r" + f"tfshards {args.command}: interrupted" + (f"; {hint(args)}" if hint else ""),
            file=sys.stderr,
        )
        return 130
