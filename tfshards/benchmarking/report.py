"""Write a sweep's results: results.csv, results.json, report.md and throughput.png."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tfshards.benchmarking.sweep import SweepResult

COLUMNS = [
    "shards",
    "encoding",
    "compression",
    "cycle_length",
    "convert_s",
    "convert_pairs_per_s",
    "bytes",
    "disk_ratio",
    "cold_pairs_per_s",
    "cold_spread",
    "cold_mb_per_s",
    "cold_cpu_ms_per_pair",
    "warm_pairs_per_s",
    "warm_spread",
    "warm_cpu_ms_per_pair",
    "peak_rss_mib",
    "cold_vs_keras",
    "warm_vs_keras_cached",
    "cold_vs_ceiling",
]


def write_report(result: SweepResult, folder: Path) -> list[Path]:
    """Write every output; return the paths written (the plot only with matplotlib)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [
        _csv(result, folder / "results.csv"),
        _json(result, folder / "results.json"),
        _markdown(result, folder / "report.md"),
    ]
    plot = _plot(result, folder / "throughput.png")
    if plot is not None:
        written.append(plot)
    return written


def _csv(result: SweepResult, path: Path) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: row.get(k) for k in COLUMNS} for row in result.rows)
    return path


def _json(result: SweepResult, path: Path) -> Path:
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return path


def markdown(result: SweepResult) -> str:
    machine = result.machine
    lines = [
        "# tfshards bench",
        "",
        f"{result.pairs} pairs ({result.source_bytes / 2**20:.1f} MiB of source files); "
        f"{machine.get('cores')} cores, {machine.get('ram_gib')} GiB RAM, TensorFlow "
        f"{machine.get('tensorflow')}; {result.page_cache}; median of "
        f"{result.config.repeats} passes, spread = (max - min) / median.",
        *([result.config.note] if result.config.note else []),
        "" if result.complete else "**Interrupted: partial results.**",
        "",
        "cold = streamed from the shards, decoding every pair; warm = read from "
        "read(cache=...)'s disk cache of decoded pixels, after the pass that builds it.",
        *([result.warm_slower()] if result.warm_slower() else []),
        "",
        "Baselines (pairs/s): " + ", ".join(f"{k} {v}" for k, v in result.baselines.items()),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(str(row.get(k, "")) for k in COLUMNS) + " |" for row in result.rows]
    best = result.recommendation()
    lines += ["", "## Recommendation", ""]
    if best is None:
        lines.append(result.why_no_recommendation())
    else:
        row = best["row"]
        lines += [
            f"{best['rule']}: {row['shards']} shards, {row['encoding']}, "
            f"{row['compression']}, cycle length {row['cycle_length']} "
            f"({row['cold_pairs_per_s']} pairs/s cold, {row['cold_vs_keras']}x the Keras "
            "pipeline's first epoch).",
            "",
            "```",
            best["convert"],
            best["read"],
            "```",
        ]
    return "\n".join(lines) + "\n"


def _markdown(result: SweepResult, path: Path) -> Path:
    path.write_text(markdown(result))
    return path


def plot_series(result: SweepResult) -> dict[str, tuple[list[int], list[float]]]:
    """Label -> (shard counts, pairs/s at the best cycle length), cold and warm."""
    series = {}
    for encoding in dict.fromkeys(r["encoding"] for r in result.rows):
        for compression in dict.fromkeys(r["compression"] for r in result.rows):
            rows = [
                r
                for r in result.rows
                if r["encoding"] == encoding and r["compression"] == compression
            ]
            for kind in ("cold", "warm"):
                best: dict[int, float] = {}
                for row in rows:  # the best cycle length per shard count
                    rate = row[f"{kind}_pairs_per_s"]
                    best[row["shards"]] = max(best.get(row["shards"], 0), rate)
                if best:
                    xs = sorted(best)
                    series[f"{encoding}/{compression} {kind}"] = (xs, [best[x] for x in xs])
    return series


def _plot(result: SweepResult, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(figsize=(8, 5))
    for label, (xs, ys) in plot_series(result).items():
        warm = label.endswith("warm")
        axes.plot(xs, ys, marker="s" if warm else "o", linestyle="--" if warm else "-", label=label)
    for (name, value), style in zip(result.baselines.items(), ("--", ":", "-."), strict=False):
        axes.axhline(value, linestyle=style, color="gray", label=f"{name} ({value:.0f})")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("shards")
    axes.set_ylabel("pairs/s (best cycle length): cold stream -, warm cache --")
    axes.set_title(f"tfshards bench: {result.pairs} pairs")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
