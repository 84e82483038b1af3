"""The README and the manual: every example runs (on tiny data made here, S3 examples
against the suite's moto server), and the API reference covers every public name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from docs_examples import ROOT, examples, pages
from s3_server import s3_environment

import tfshards

PAGES = [page.relative_to(ROOT).as_posix() for page in pages()]
RUNNABLE = [p for p in PAGES if any(e.kind and not e.skip for e in examples(ROOT / p))]
BUCKET = "my-bucket"  # the name the examples use


def test_every_example_either_runs_or_says_why_not():
    every = [e for page in pages() for e in examples(page) if e.kind]
    skipped = [e for e in every if e.skip]
    assert len(every) >= 30
    assert len(skipped) <= 8, [e.where for e in skipped]  # few, each with its reason
    for e in skipped:
        assert len(e.skip) > 10, f"{e.where}: say why it cannot run"


def test_unknown_markers_are_refused(tmp_path, monkeypatch):
    import docs_examples

    page = tmp_path / "page.md"
    page.write_text("<!-- example: skp: typo -->\n```python\nprint(1)\n```\n")
    monkeypatch.setattr(docs_examples, "ROOT", tmp_path)
    with pytest.raises(ValueError, match="unknown example marker 'skp: typo'"):
        docs_examples.examples(page)


def test_the_api_reference_covers_every_public_name():
    text = (ROOT / "docs" / "reference" / "api.md").read_text()
    documented = {path.rsplit(".", 1)[1]: path for path in re.findall(r"^::: (\S+)$", text, re.M)}
    assert sorted(documented) == sorted(tfshards.__all__)
    for name, path in documented.items():  # the path names the object itself
        obj = getattr(tfshards, name)
        assert f"{obj.__module__}.{obj.__qualname__}" == path


def test_the_cli_reference_is_generated_from_the_parser():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from generated import cli_reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    text = cli_reference()
    from tfshards.cli import build_parser

    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert len(subcommands) >= 8
    for command, parser in subcommands.items():
        assert f"## `tfshards {command}`" in text
        assert parser.format_usage().split("\n")[0][len("usage: ") :] in text


def _shims(folder: Path) -> Path:
    """`tfshards` and `python` on PATH run this interpreter and this checkout."""
    folder.mkdir()
    for name, command in (("tfshards", "-m tfshards.cli"), ("python", ""), ("python3", "")):
        shim = folder / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command} "$@"\n')
        shim.chmod(0o755)
    return folder


def _fresh_bucket(server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """s3://my-bucket on the suite's moto server, empty, and the environment for it."""
    env = s3_environment(server.endpoint)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if fs.exists(BUCKET):
        fs.rm(BUCKET, recursive=True)
    fs.mkdir(BUCKET)
    return env


@pytest.mark.parametrize("page", RUNNABLE)
def test_examples_run(page, tmp_path, request, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    shims = _shims(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KERAS_"))}
    if "s3://" in (ROOT / page).read_text():  # S3 examples run against the moto server
        env.update(_fresh_bucket(request.getfixturevalue("s3_server"), monkeypatch))
    env.update(
        PATH=f"{shims}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        XDG_CACHE_HOME=str(tmp_path / "cache"),  # shard and decoded caches stay in tmp_path
        MPLBACKEND="Agg",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "docs_examples.py"), page],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # Keras warns on fit(shuffle=True) with a tf.data dataset; the docs pass shuffle=False.
    assert "will be ignored since the data `x` was provided as a tf.data" not in output


def test_the_readme_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    skipped = [e for e in examples(ROOT / "README.md") if e.skip]
    commands = [e.code.strip() for e in skipped if "pip install" in e.code]
    assert commands == [
        "python -m pip install . && tfshards demo",
        'python -m pip install -e ".[test]" && python -m pytest -q',
    ]
    for command in commands:
        assert command in ci, f"{command!r} is not a line of .ci/run"
        assert readme.count(command) == 1
    assert any(line.startswith("mkdocs build --strict") or " mkdocs build --strict" in line
               for line in ci)  # fmt: skip
