"""Scores under bf16 against fp32 and against MTEB's published numbers.

    python experiments/precision.py [--data-dir DIR] [--out results/eval/precision.json]

1. MTEB's tasks for all-MiniLM-L6-v2 (STS-B, SICK-R, STS12-16 Spearman, Banking77 accuracy; the last layer, all
   384 dims, mean pooling) encoded in fp32 and in bf16 (`Encoder.from_pretrained(..., precision=)`), beside MTEB's
   published numbers (matryoshka_lab.eval.MTEB_ALL_MINILM_L6_V2).
2. The demo grid (`matryoshka-lab demo`: STS-B, SICK-R, CLINC150 at every hidden state x prefix dim) in bf16
   against the committed fp32 grid results/demo/grid.csv: the largest cell difference per task and metric.
Writes one JSON file with what made it (reads the datasets from $MATRYOSHKA_LAB_DATA or --data-dir).
"""
import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd

from matryoshka_lab.cli import DEMO_TASKS
from matryoshka_lab.core import provenance
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import MTEB_ALL_MINILM_L6_V2, evaluate
from matryoshka_lab.runs import write_json

ROOT = Path(__file__).resolve().parents[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=str(ROOT / "results" / "eval" / "precision.json"))
    args = p.parse_args()
    made = provenance("python experiments/precision.py " + shlex.join(sys.argv[1:]))    # the code that runs: its commit now
    fp32_grid = pd.read_csv(ROOT / "results" / "demo" / "grid.csv").set_index(["task", "metric", "layer", "dim"]).value
    encoders = {prec: Encoder.from_pretrained("embedded", precision=prec) for prec in ("fp32", "bf16")}

    tasks = sorted({t for t, _ in MTEB_ALL_MINILM_L6_V2})
    last = {prec: evaluate(enc, tasks, layers="-1", dims="384", data_dir=args.data_dir)
            .set_index(["task", "metric"]).value for prec, enc in encoders.items()}
    mteb = [{"task": task, "metric": metric, "published": ref, **{prec: round(float(v[task, metric]), 4)
                                                                  for prec, v in last.items()}}
            for (task, metric), ref in MTEB_ALL_MINILM_L6_V2.items()]

    for task in ("stsb", "sickr"):        # the committed grid is this code's fp32: its full-size last-layer cells agree
        top = fp32_grid[task, "spearman", fp32_grid.index.get_level_values("layer").max(), 384]
        assert abs(top - last["fp32"][task, "spearman"]) < 1e-3, (task, top, last["fp32"][task, "spearman"])
    bf16_grid = evaluate(encoders["bf16"], DEMO_TASKS, layers="all", dims="16,32,64,128,256,384",
                         data_dir=args.data_dir).set_index(["task", "metric", "layer", "dim"]).value
    diff = (bf16_grid - fp32_grid).abs().dropna()
    demo = [{"task": task, "metric": metric, "cells": int(len(d)), "max_abs_diff": round(float(d.max()), 4),
             "at": f"L{d.idxmax()[0]} d{d.idxmax()[1]}"}
            for (task, metric), d in ((k, g.droplevel([0, 1])) for k, g in diff.groupby(level=["task", "metric"]))]

    record = {**made, "model": "embedded", "mteb": mteb, "demo_grid_bf16_vs_fp32": demo}
    for row in mteb:
        print(f"{row['task']:10s} {row['metric']:9s} fp32 {row['fp32']:6.2f}  bf16 {row['bf16']:6.2f}  "
              f"MTEB {row['published']:6.2f}")
    for row in demo:
        print(f"demo grid {row['task']} {row['metric']}: largest |bf16 - fp32| {row['max_abs_diff']} at {row['at']} "
              f"over {row['cells']} cells")
    write_json(args.out, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
