"""Latency CDFs of a live benchmark, one line per target (matplotlib, optional)."""

from __future__ import annotations

import numpy as np

from gpuroute.console.tables import pyplot


def plot_live(report: dict, out: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, key, label in ((axes[0], "_ttft", "TTFT (s)"), (axes[1], "_e2e", "end-to-end (s)")):
        for target in report["targets"]:
            values = np.sort(np.asarray(target.get(key, []), dtype=float))
            if values.size:
                axis.plot(
                    values, np.arange(1, values.size + 1) / values.size, label=target["target"]
                )
        axis.set_xscale("log")
        axis.set_xlabel(label)
        axis.set_ylabel("fraction of requests")
        axis.grid(True, alpha=0.3)
    axes[1].legend(loc="lower right")
    load, scale = report["target_utilization"], report["time_scale"]
    fig.suptitle(f"{report['trace']} at {load:.0%}, time scale {scale:g}")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
