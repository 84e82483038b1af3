"""The examples of the README and the manual, found and run as the tests run them.

    python tests/docs_examples.py PAGE.md     # run PAGE's examples here, in order

The convention (CONTRIBUTING.md, "Examples in the docs"): every ```python, ```bash,
```sh and ```console block runs, in page order, in one fresh empty folder per page and
one process per page. A Python block runs in a namespace of its own (``__name__`` is
"__main__"), so it must work saved as a file alone; files that earlier blocks wrote
(``data/``, ``shards/``) are there. Shell blocks run with ``bash -e -o pipefail``;
in a ```console block only the lines starting with ``$ `` run (the rest is output).
A block the tests must not run has, on the line right before its fence,

    <!-- example: skip: REASON -->

and the built site shows REASON above it. Blocks of other languages (```text, ```json)
are never run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"^<!-- example: (?P<what>.*?) -->$")
KINDS = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "console": "console"}


@dataclass(frozen=True)
class Example:
    page: str  # relative to the repository root
    line: int  # the fence's line, 1-based
    lang: str
    code: str
    skip: str | None  # the reason, for a block the tests do not run

    @property
    def kind(self) -> str | None:
        return KINDS.get(self.lang)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of the manual (docs/, not its hooks)."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [ROOT / "README.md", *docs]


def examples(page: Path) -> list[Example]:
    """Every fenced block of a page, with the marker on the line before it, if any."""
    lines = page.read_text().split("\n")
    name = page.relative_to(ROOT).as_posix()
    found, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next((j for j in range(index + 1, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise ValueError(f"{name}:{index + 1}: a code block is never closed")
        marker = MARKER.match(lines[index - 1].strip()) if index else None
        skip = None
        if marker:
            what = marker["what"]
            if not what.startswith("skip: ") or not what[len("skip: ") :].strip():
                raise ValueError(
                    f"{name}:{index}: unknown example marker {what!r}; the one marker is "
                    "'<!-- example: skip: REASON -->'"
                )
            skip = what[len("skip: ") :].strip()
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Example(name, index + 1, fence["lang"], code, skip))
        index = end + 1
    return found


def run(example: Example) -> None:
    """Run one example in this process's folder; raise on failure."""
    if example.kind == "python":
        # Padding keeps the page's line numbers in tracebacks.
        code = compile("\n" * example.line + example.code, example.page, "exec")
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
        return
    if example.kind == "console":
        script = "\n".join(x[2:] for x in example.code.splitlines() if x.startswith("$ "))
    else:
        script = example.code
    subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], check=True)


def main(page: str) -> int:
    for example in examples(ROOT / page):
        if example.kind is None or example.skip:
            continue
        started = time.perf_counter()
        print(f"=== {example.where} ({example.lang})", flush=True)
        try:
            run(example)
        except BaseException as exc:
            print(f"=== {example.where} FAILED: {exc!r}", file=sys.stderr, flush=True)
            raise
        print(f"=== {example.where} ok in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
