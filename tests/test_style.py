"""CONTRIBUTING.md's size rules, checked on the source rather than left to review:
no function body over 60 lines in the package, and at most 8 scripts at the top of
benchmarks/ (what a user runs; one-off studies live in benchmarks/studies/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_BODY_LINES = 60
MAX_BENCHMARK_SCRIPTS = 8  # 7 until issue 46 asked for benchmarks/large_images.py


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement of the body (a docstring counts) to the last, blank
    lines and comments between them included; the signature and decorators do not count."""
    return function.end_lineno - function.body[0].lineno + 1


def long_functions(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename=filename)
    return [
        f"{filename}:{node.lineno} {node.name}: {body_lines(node)} lines"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and body_lines(node) > MAX_BODY_LINES
    ]


def test_no_function_body_over_60_lines():
    found = []
    for path in sorted((ROOT / "tfshards").rglob("*.py")):
        found += long_functions(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "split these functions (at most 60 lines of body each):\n" + "\n".join(found)


def test_the_length_check_counts_the_body_and_finds_nested_functions():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_BODY_LINES))
    fits = f"@decorator\ndef f(\n    a,\n    b,\n):\n{body}"
    assert long_functions(fits, "fits.py") == []  # 60 lines: the signature is not counted
    nested = "class C:\n    def m(self):\n        async def inner():\n" + "".join(
        f"            y{i} = {i}\n" for i in range(MAX_BODY_LINES + 1)
    )
    assert long_functions(nested, "nested.py") == [
        "nested.py:2 m: 62 lines",  # the nested function is part of its body
        "nested.py:3 inner: 61 lines",
    ]


def benchmark_scripts() -> list[str]:
    """The scripts a user runs: benchmarks/*.py, not the helpers named with a leading `_`."""
    return sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def test_benchmarks_keep_at_most_8_scripts_at_their_top():
    scripts = benchmark_scripts()
    assert len(scripts) <= MAX_BENCHMARK_SCRIPTS, (
        f"{len(scripts)} scripts at the top of benchmarks/ (at most {MAX_BENCHMARK_SCRIPTS}): "
        f"{scripts}; fold one into another as an option, or move a one-off into studies/"
    )


def test_every_benchmark_and_study_is_in_its_readme_table():
    for folder in (ROOT / "benchmarks", ROOT / "benchmarks" / "studies"):
        table = (folder / "README.md").read_text()
        for script in folder.glob("[!_]*.py"):
            assert f"| `{script.name}` |" in table, f"{script.relative_to(ROOT)} not in its README"


def test_benchmark_paths_named_in_docs_and_code_exist():
    named = re.compile(r"benchmarks/(?:studies/)?\w+\.py")
    texts = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")]
    texts += [*(ROOT / "tfshards").rglob("*.py")]
    missing = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in texts
        for name in named.findall(path.read_text())
        if not (ROOT / name).is_file()
    ]
    assert not missing, "these name benchmark scripts that do not exist:\n" + "\n".join(missing)
