"""Tier usage over time as a PNG, from a run's report (needs the ``report`` extra: matplotlib)."""

from __future__ import annotations

from pathlib import Path

from .config import SeaConfigError
from .report import RunReport


def plot_timeline(report: RunReport, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SeaConfigError("plotting needs matplotlib: pip install matplotlib") from None
    if not report.timeline:
        raise SeaConfigError("this report has no timeline (no node ran on a fast tier)")
    times = [point[0] for point in report.timeline]
    fig, (usage, queue) = plt.subplots(2, 1, sharex=True, figsize=(8, 5), height_ratios=[3, 1])
    for i, tier in enumerate(report.tiers[:-1]):
        usage.step(times, [point[1][i] / 2**20 for point in report.timeline], where="post", label=tier.path)
    usage.set_ylabel("held on the tier (MiB)")
    usage.legend(loc="upper right")
    usage.set_title(f"Sea: {report.nodes_run} nodes run in {report.makespan_seconds:.1f} s")
    queue.step(times, [point[2] for point in report.timeline], where="post", color="tab:orange")
    queue.set_ylabel("stager queue")
    queue.set_xlabel("seconds since the run started")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
