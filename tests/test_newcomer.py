"""A newcomer's first hour: 0/255 binary masks, a quiet CLI, and an install that leaves the
user's TensorFlow build alone (the README's and the manual's examples run in test_docs.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_pairs
from PIL import Image

import tfshards
from tfshards.cli import main

ROOT = Path(__file__).resolve().parent.parent
NOISE = ("absl", "oneDNN", "cpu_feature_guard", "cuInit", "I0000", "W0000", "E0000")


def test_missing_split_names_the_option_that_makes_it(tmp_path):
    images, masks = write_pairs(tmp_path / "data", 6)
    tfshards.convert(images, masks, tmp_path / "out", workers=1, progress=False)
    with pytest.raises(tfshards.ManifestError, match="no split 'val'.*--val-fraction"):
        tfshards.read(tmp_path / "out", split="val")


def binary_masks(root: Path, count: int = 12) -> tuple[Path, Path]:
    """Grayscale images whose masks are their bright pixels, saved as 0/255 PNGs."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for index in range(count):
        image = rng.integers(0, 256, (24, 24), dtype=np.uint8)
        Image.fromarray(image).save(root / "images" / f"{index:02d}.png")
        Image.fromarray(np.where(image > 127, 255, 0).astype(np.uint8)).save(
            root / "masks" / f"{index:02d}.png"
        )
    return root / "images", root / "masks"


def test_binary_masks_stop_before_writing_then_convert_read_and_fit(tmp_path, capsys):
    images, masks = binary_masks(tmp_path / "data")
    out = tmp_path / "out"
    base = ["convert", "--images", str(images), "--masks", str(masks), "--out", str(out)]
    assert main(["-q", *base, "--val-fraction", "0.3"]) == 1
    error = capsys.readouterr().err
    assert "0 and 255" in error and "--binary-masks" in error
    assert not out.exists() or not any(out.iterdir()), "nothing written"
    assert main(["-q", *base, "--val-fraction", "0.3", "--binary-masks"]) == 0
    manifest = tfshards.Manifest.load(out)
    assert manifest.mask.num_classes == 2
    assert all(split.mask_values == [0, 1] for split in manifest.splits.values())
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    table = capsys.readouterr().out
    assert "--binary-masks (0 -> class 0; 255, or 1, -> class 1)" in table
    assert re.search(r"^\s+1\s+\d+\s+\d+\.\d+%", table, flags=re.M), table
    assert "1,255" not in table and "1 channel," in table
    assert not re.search(r"^\s+2\s", table, flags=re.M), "only classes present are listed"

    import keras

    train = tfshards.read(out, batch_size=4, image_dtype="uint8", cache=True, seed=0)
    assert int(max(np.max(m) for _, m in train)) == 1
    model = keras.Sequential(
        [
            keras.Input((24, 24, 1)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(2, 1),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(train, validation_data=tfshards.read(out, split="val"), epochs=1)
    assert np.isfinite(history.history["loss"][0])


def test_read_refuses_stored_0_255_masks_naming_the_fix(tmp_path):
    images, masks = binary_masks(tmp_path / "data")
    out = tmp_path / "out"
    tfshards.convert(images, masks, out, num_classes=256, workers=1, progress=False)
    body = json.loads((out / "tfshards.json").read_text())
    body["mask"]["num_classes"] = None  # as a dataset converted before the check existed
    (out / "tfshards.json").write_text(json.dumps(body))
    with pytest.raises(tfshards.ManifestError, match=r"0 and 255.*--binary-masks"):
        tfshards.read(out)
    body["mask"]["num_classes"] = 2  # declares fewer classes than the masks hold
    (out / "tfshards.json").write_text(json.dumps(body))
    with pytest.raises(tfshards.ManifestError, match="declares 2 classes but .* value 255"):
        tfshards.read(out)


def test_other_gaps_in_mask_values_are_a_warning_not_an_error(tmp_path, caplog):
    images, masks = write_pairs(tmp_path / "data", 6)
    for path in masks.iterdir():  # values 0, 1, 2 -> 0, 10, 20
        values = np.asarray(Image.open(path).convert("L")) * 10
        Image.fromarray(values.astype(np.uint8)).save(path)
    tfshards.convert(images, masks, tmp_path / "out", workers=1, progress=False)
    assert "not 0..K-1" in caplog.text and "--mask-map" in caplog.text


def test_cli_prints_no_tensorflow_noise_by_default(tmp_path):
    images, _ = write_pairs(tmp_path / "data", 4)
    for command in (["demo", "--count", "12", "--size", "16"], ["cache", "list", str(images)]):
        done = subprocess.run(
            [sys.executable, "-m", "tfshards.cli", *command],
            capture_output=True,
            text=True,
            env={k: v for k, v in __import__("os").environ.items() if not k.startswith("TF_")},
        )
        assert done.returncode == 0, done.stderr
        assert not [line for line in done.stderr.splitlines() if any(n in line for n in NOISE)]


def test_install_metadata_asks_for_tensorflow_never_tensorflow_cpu():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]]
    assert "tensorflow" in names and "tensorflow-cpu" not in names
    for extra in project["optional-dependencies"].values():
        assert not any(d.lower().startswith("tensorflow-cpu") for d in extra)


# Python as in an install without TensorFlow (docs/frameworks.md): importing it fails.
WITHOUT_TENSORFLOW = """
import sys

class NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorflow":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTensorFlow())
from tfshards.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "command",
    [
        ["demo", "--count", "8", "--size", "16"],
        ["-v", "demo", "--count", "8", "--size", "16"],  # TensorFlow imported later
        ["bench", "--synthetic", "8", "--size", "16", "--quick"],
    ],
)
def test_commands_that_need_tensorflow_say_how_to_install_it(tmp_path, command):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TENSORFLOW, *command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    name = command[1] if command[0] == "-v" else command[0]
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert last.startswith(f"tfshards {name}: error: this command needs TensorFlow")
    assert re.search(f'{re.escape(sys.executable)} -m pip install "tensorflow(>=[.0-9]+)?"$', last)


def test_the_install_without_tensorflow_from_a_clone_is_what_ci_runs():
    page = (ROOT / "docs" / "frameworks.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "    pip install --no-deps .\n" in page  # `--no-deps tfshards` asks an index
    assert "pip install --quiet --no-deps -e .\n" in ci
    assert "KERAS_BACKEND=jax" in page.split("## JAX and Grain", 1)[1]
