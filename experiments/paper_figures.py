"""The committed 3-seed baselines as a paper prints them (results/paper/, RESULTS.md), drawn by matryoshka_lab.figures.

    python experiments/paper_figures.py [--summary results/baselines/angle/summary.csv] [--out results/paper]

Reads a baselines summary (experiments/baselines.py: one row per method, seed, task, layer, dim, metric) and writes,
each as SVG and as a 300-dpi PNG of 3.5 x 2.5 inches (one column): STS-B Spearman against prefix size at the last
layer, one line per method with its mean and 95 % t-interval over the seeds (figures.prefix_chart), and the layer x
dim difference of MRL's seed mean from the plain fine-tune's (figures.difference_chart). meta.json says what made them.
"""
import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd

from matryoshka_lab.core import provenance
from matryoshka_lab.figures import difference_chart, prefix_chart, save
from matryoshka_lab.runs import write_json

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["untrained", "base", "mrl", "2dmse", "ese"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--summary", type=Path, default=ROOT / "results" / "baselines" / "angle" / "summary.csv")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "paper")
    p.add_argument("--task", default="stsb")
    a = p.parse_args()
    grid = pd.read_csv(a.summary)
    grid = grid[grid.method.isin(METHODS)]
    seed_mean = lambda m: grid[grid.method == m].groupby(["task", "layer", "dim", "metric"], as_index=False).value.mean()
    figures = {f"prefix_{a.task}": (prefix_chart(grid, a.task, "spearman", by="method"), (3.5, 2.5)),
               f"mrl_minus_base_{a.task}": (difference_chart(seed_mean("mrl"), seed_mean("base"), a.task, "spearman",
                                                             ("MRL", "base")), (3.5, 2.5))}
    written = []
    for name, (chart, (w, h)) in figures.items():
        for ext in (".svg", ".png"):
            written.append(save(chart, a.out / f"{name}{ext}", w, h, dpi=300).name)
    write_json(a.out / "meta.json", {"summary": str(a.summary.relative_to(ROOT)) if a.summary.is_relative_to(ROOT) else str(a.summary),
                                     "methods": METHODS, "seeds": sorted(int(s) for s in grid.seed.unique()),
                                     "files": written, "size_in": [3.5, 2.5], "dpi": 300,
                                     **provenance(shlex.join(["python", *sys.argv]))})
    print("\n".join(str(a.out / f) for f in written))


if __name__ == "__main__":
    main()
