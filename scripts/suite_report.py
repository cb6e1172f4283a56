"""Tables (text and Markdown) and plots of bench_suite.py's model sweep and measured runs.

    from suite_report import model_table, measured_table, plot_volume_vs_bound
    print(model_table(rows))                       # fixed-width text
    print(model_table(rows, markdown=True))        # GitHub Markdown
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from bench_executor import median_spread
from deinsum.runtime.runner import PHASES

BOUNDARY = ("distribute", "gather")
IN_GRID_COMMUNICATION = ("reduce", "redistribute")


def render(headers: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """A table as fixed-width text or as a Markdown pipe table."""
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(r[c]) for r in [headers] + rows) for c in range(len(headers))]
    lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in [headers] + rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def number(x, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def spread(median: float, low: float, high: float) -> str:
    return f"{median:.4f} [{low:.4f}, {high:.4f}]"


def seconds(samples) -> str:
    """Median [min, max] of ``samples`` seconds."""
    return spread(*median_spread(samples))


def sizes_label(sizes: dict[str, int]) -> str:
    """Each distinct size once, named by its first index: ``i=1724,a=42``."""
    first: dict[int, str] = {}
    for c, n in sizes.items():
        first.setdefault(n, c)
    return ",".join(f"{c}={n}" for n, c in first.items())


# ------------------------------------------------------------------------------------------ model sweep

def model_table(rows, markdown: bool = False) -> str:
    headers = ["kernel", "P", "sizes", "deinsum grid(s)", "idle", "bytes/rank", "best known", "ours/best",
               "bound (any fusion)", "bound (this fusion)", "ours/bound", "artifact bytes/rank", "artifact/ours",
               "plan"]
    cells = []
    for r in rows:
        ratio = r.ratio_to_bound
        flag = " (below bound)" if ratio is not None and ratio < 1 else ""
        cells.append([r.kernel, str(r.nprocs), sizes_label(r.sizes), " ".join(r.grids) or "-",
                      str(r.idle) if r.grids else "-", number(r.received_max), number(r.construction),
                      number(r.ratio_to_construction, 3), number(r.lower_bound), number(r.schedule_bound),
                      (number(ratio, 3) + flag) if ratio is not None else "-",
                      number(r.artifact_bytes), number(r.artifact_over_ours, 3),
                      r.failure or f"{r.plan_seconds:.1f} s"])
    return render(headers, cells, markdown)


def plot_volume_vs_bound(rows, path: Path) -> Path:
    """Per kernel: busiest rank's modeled bytes, the best known construction, the bound of the chosen fusion and
    the artifact's volume over P (log-log)."""
    kernels = list(dict.fromkeys(r.kernel for r in rows))
    fig, axes = _subplots(len(kernels))
    for ax, kernel in zip(axes, kernels):
        mine = [r for r in rows if r.kernel == kernel]
        for label, value, style in (("deinsum (model)", lambda r: r.received_max, "o-"),
                                    ("best known construction", lambda r: r.construction, "kx"),
                                    ("lower bound (this fusion)", lambda r: r.schedule_bound, "k--"),
                                    ("artifact grid", lambda r: r.artifact_bytes, "s")):
            points = [(r.nprocs, value(r)) for r in mine if value(r)]
            if points:
                ax.plot(*zip(*points), style, label=label, markersize=4)
        ax.set(xscale="log", yscale="log", title=kernel, xlabel="P")
        ax.title.set_fontsize(9)
    axes[0].set_ylabel("bytes received per rank")
    return _save(fig, path, legend_from=axes[0])


# ------------------------------------------------------------------------------------------ measured runs

def phase_median(run: dict, phases) -> float:
    return sum(float(np.median(run["phases"][p])) for p in phases)


def measured_table(runs: list[dict], markdown: bool = False) -> str:
    headers = ["kernel", "P x threads", "grid(s)", "end-to-end s", "in-grid s", "compute s", "communication s",
               "recv bytes/rank (max)", "bytes = model", "opt_einsum s (threads)", "end-to-end / opt_einsum"]
    cells = []
    for run in runs:
        ratio = np.median(run["wall"]) / run["opt_einsum"][0]
        cells.append([run["name"], f"{run['nprocs']} x {run['threads']}", " ".join(run["grids"]), seconds(run["wall"]),
                      seconds(run["in_grid"]), f"{phase_median(run, ('compute',)):.4f}",
                      f"{phase_median(run, BOUNDARY + IN_GRID_COMMUNICATION):.4f}", str(max(run["bytes_received"])),
                      "yes" if run["matches_model"] else "NO", f"{spread(*run['opt_einsum'])} ({run['opt_threads']})",
                      f"{ratio:.3f}"])
    return render(headers, cells, markdown)


def phase_table(runs: list[dict], markdown: bool = False) -> str:
    """Median [min, max] of every phase on the slowest rank, phases that occur in any run."""
    present = [p for p in PHASES if any(any(run["phases"][p]) for run in runs)]
    cells = [[run["name"], f"{run['nprocs']} x {run['threads']}"] + [seconds(run["phases"][p]) for p in present]
             for run in runs]
    return render(["kernel", "P x threads"] + [f"{p} s" for p in present], cells, markdown)


def plot_time_breakdown(runs: list[dict], path: Path) -> Path:
    """Per kernel and P: stacked compute / in-grid communication / initial distribution + gather, opt_einsum marked."""
    kernels = list(dict.fromkeys(run["name"] for run in runs))
    fig, axes = _subplots(len(kernels))
    parts = (("compute", ("compute",), "tab:blue"), ("reduce + redistribute", IN_GRID_COMMUNICATION, "tab:orange"),
             ("distribute + gather", BOUNDARY, "tab:gray"))
    for ax, kernel in zip(axes, kernels):
        mine = [run for run in runs if run["name"] == kernel]
        x = np.arange(len(mine))
        bottom = np.zeros(len(mine))
        for label, phases, color in parts:
            height = np.array([phase_median(run, phases) for run in mine])
            ax.bar(x, height, bottom=bottom, color=color, label=label, width=0.6)
            bottom += height
        top = 1.3 * bottom.max()
        reference = np.array([run["opt_einsum"][0] for run in mine])
        shown = reference <= top
        ax.plot(x[shown], reference[shown], "kx", label="opt_einsum (same threads)")
        for xi, value in zip(x[~shown], reference[~shown]):   # off the scale (e.g. oversubscribed threads)
            ax.annotate(f"opt_einsum\n{value:.3g} s", (xi, 0.97 * top), ha="center", va="top", fontsize=6)
        ax.set_ylim(0, top)
        ax.set_xticks(x, [f"{run['nprocs']}x{run['threads']}" for run in mine])
        ax.set(title=kernel, xlabel="P x threads")
        ax.title.set_fontsize(9)
    axes[0].set_ylabel("seconds (median, slowest rank)")
    return _save(fig, path, legend_from=axes[0])


def _subplots(count: int):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    columns = min(count, 5)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.8 * rows), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def _save(fig, path: Path, legend_from) -> Path:
    """Write ``fig`` with one legend (``legend_from``'s) below the panels."""
    import matplotlib.pyplot as plt
    fig.legend(*legend_from.get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
