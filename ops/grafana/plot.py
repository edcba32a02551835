#!/usr/bin/env python3
"""A picture of a few dashboard panels over one run of the demo, from the answers
scripts/ops-e2e.sh keeps (OPS_E2E_KEEP=DIR writes DIR/answers.json). Needs matplotlib.

usage: python3 ops/grafana/plot.py DIR/answers.json docs/img/ops-e2e.png"""
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("Lock outcomes per second", "lock calls / s"),
    ("Acquire latency (p50 / p95 / p99) by outcome", "seconds"),
    ("Voter errors by kind per second", "errors / s"),
    ("Replay outcomes per second", "answers / s"),
]


def legend(fmt, metric):
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def main(src, dst):
    data = json.load(open(src))
    start = data["start"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    for ax, (title, ylabel) in zip(axes.flat, PANELS):
        for key, answer in sorted(data["answers"].items()):
            panel, fmt = key.split(" | ", 1)
            if panel != title:
                continue
            for series in answer["result"]:
                pts = [(float(t) - start, float(v)) for t, v in series["values"]]
                pts = [(t, v) for t, v in pts if math.isfinite(v)]
                if not pts or max(v for _, v in pts) == 0:
                    continue
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=legend(fmt, series["metric"]), linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    for ax in axes[1]:
        ax.set_xlabel("seconds since the demo started", fontsize=9)
    fig.suptitle("tower-redlock dashboard queries over one run of scripts/demo.sh "
                 "(scripts/ops-e2e.sh, scrape interval 1 s)", fontsize=11)
    fig.tight_layout()
    fig.savefig(dst, dpi=90)
    print(f"wrote {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
