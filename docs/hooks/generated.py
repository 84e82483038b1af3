"""MkDocs hook: the parts of the manual generated at build time, so they cannot go stale.

- ``<!-- cli-help -->`` becomes the ``--help`` of ``tfshards`` and of every subcommand,
  taken from the argparse parser the command itself builds (tfshards.cli.build_parser).
- ``<!-- example: skip: REASON -->`` (an example the tests do not run, see
  CONTRIBUTING.md) becomes a visible note above its block, giving the reason.
"""

from __future__ import annotations

import argparse
import os
import re

SKIP = re.compile(r"^<!-- example: skip: (?P<reason>.+?) -->$", re.M)


def _subcommands(parser: argparse.ArgumentParser, prefix: str):
    yield prefix, parser
    for action in parser._actions:  # argparse keeps its subparsers here, nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, f"{prefix} {name}")


def cli_reference() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps help text to the terminal's width
    from tfshards.cli import build_parser

    sections = []
    for command, parser in _subcommands(build_parser(), "tfshards"):
        level = "##" if command.count(" ") <= 1 else "###"
        help_text = parser.format_help().rstrip()
        sections.append(f"{level} `{command}`\n\n```text\n{help_text}\n```\n")
    return "\n".join(sections)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- cli-help -->" in markdown:
        markdown = markdown.replace("<!-- cli-help -->", cli_reference())
    return SKIP.sub(lambda m: f'!!! note "Not run by the tests"\n    {m["reason"]}\n', markdown)
