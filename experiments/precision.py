"""Scores under bf16 against fp32 and against MTEB's published numbers.

    python experiments/precision.py [--data-dir DIR] [--out results/eval/precision.json]

1. MTEB's tasks for all-MiniLM-L6-v2 (STS-B, SICK-R, STS12-16 Spearman, Banking77 accuracy; the last layer, all
   384 dims, mean pooling) encoded in fp32 and in bf16 (`Encoder.from_pretrained(..., precision=)`), beside MTEB's
   published numbers (matryoshka_lab.eval.MTEB_ALL_MINILM_L6_V2).
2. The demo grid (`matryoshka-lab demo`: STS-B, SICK-R, CLINC150 at every hidden state x prefix dim) in bf16
   against the fp32 grid: the largest cell difference per task and metric.
Writes one JSON file with what made it (reads the datasets from $MATRYOSHKA_LAB_DATA or --data-dir).
"""
import argparse
import json
import shlex
import sys
from pathlib import Path

from matryoshka_lab.cli import DEMO_TASKS
from matryoshka_lab.core import provenance
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import MTEB_ALL_MINILM_L6_V2, evaluate

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp32", "bf16")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=str(ROOT / "results" / "eval" / "precision.json"))
    args = p.parse_args()
    encoders = {prec: Encoder.from_pretrained("embedded", precision=prec) for prec in PRECISIONS}

    tasks = sorted({t for t, _ in MTEB_ALL_MINILM_L6_V2})
    last = {prec: evaluate(enc, tasks, layers="-1", dims="384", data_dir=args.data_dir)
            .set_index(["task", "metric"]).value for prec, enc in encoders.items()}
    mteb = [{"task": task, "metric": metric, "published": ref, **{prec: round(float(last[prec][task, metric]), 4)
                                                                  for prec in PRECISIONS}}
            for (task, metric), ref in MTEB_ALL_MINILM_L6_V2.items()]

    grids = {prec: evaluate(enc, DEMO_TASKS, layers="all", dims="16,32,64,128,256,384", data_dir=args.data_dir).set_index(["task", "metric", "layer", "dim"]).value
             for prec, enc in encoders.items()}
    diff = (grids["bf16"] - grids["fp32"]).abs()
    demo = [{"task": task, "metric": metric, "cells": int(len(d)), "max_abs_diff": round(float(d.max()), 4),
             "at": f"L{d.idxmax()[0]} d{d.idxmax()[1]}"}
            for (task, metric), d in ((k, g.droplevel([0, 1])) for k, g in diff.groupby(level=["task", "metric"]))]

    record = {**provenance("python experiments/precision.py " + shlex.join(sys.argv[1:])),
              "model": "embedded", "mteb": mteb, "demo_grid_bf16_vs_fp32": demo}
    for row in mteb:
        print(f"{row['task']:10s} {row['metric']:9s} fp32 {row['fp32']:6.2f}  bf16 {row['bf16']:6.2f}  "
              f"MTEB {row['published']:6.2f}")
    for row in demo:
        print(f"demo grid {row['task']} {row['metric']}: largest |bf16 - fp32| {row['max_abs_diff']} at {row['at']} "
              f"over {row['cells']} cells")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
