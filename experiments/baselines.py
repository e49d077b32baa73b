"""CPU-scale comparison of the baseline objectives (issue 3): no-Matryoshka, MRL, 2DMSE and ESE.

    python experiments/baselines.py [--seeds 0 1 2] [--max-steps 200] [--out runs/baselines]

Every method trains the embedded all-MiniLM-L6-v2 with unsupervised SimCSE on the same wiki sentences, with the same
steps, batch, learning rate and seeds (configs/{base,mrl,2dmse,ese}.yaml), then evaluates every hidden state x
prefix dim on STS-B, SICK-R and STS12-16 (Spearman x100). Writes OUT/summary.csv (method, seed, task, layer, dim,
value) and prints mean +- std over seeds of the average over the STS tasks, per layer and dim.
"""
import argparse
from pathlib import Path

import pandas as pd

from matryoshka_lab.trainer import Trainer, load_config

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["base", "mrl", "2dmse", "ese"]
STS = ["stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--out", default="runs/baselines")
    args = p.parse_args()
    out = Path(args.out)
    frames = []
    for seed in args.seeds:
        for method in args.methods:
            run_dir = out / f"{method}_seed{seed}"
            cfg = load_config(ROOT / "configs" / f"{method}.yaml",
                              [f"seed={seed}", f"run_dir={run_dir}", f"max_steps={args.max_steps}", "eval_every=0",
                               f"eval_tasks=[{','.join(STS)}]", "checkpoint_every=0"])
            print(f"== {method} seed {seed} -> {run_dir}", flush=True)
            Trainer(cfg, progress=False).fit()
            grid = pd.read_csv(run_dir / "grid.csv")
            frames.append(grid.assign(method=method, seed=seed))
            pd.concat(frames).to_csv(out / "summary.csv", index=False)
    df = pd.concat(frames)
    avg = df[df.metric == "spearman"].groupby(["method", "seed", "layer", "dim"]).value.mean().reset_index()
    stats = avg.groupby(["method", "layer", "dim"]).value.agg(["mean", "std"]).reset_index()
    for method in args.methods:
        tab = stats[stats.method == method]
        cell = tab.assign(s=[f"{m:.2f}+-{s:.2f}" for m, s in zip(tab["mean"], tab["std"].fillna(0))])
        print(f"\n{method}: mean over {len(STS)} STS tasks, Spearman x100, mean+-std over seeds {args.seeds}")
        print(cell.pivot(index="layer", columns="dim", values="s").to_string())


if __name__ == "__main__":
    main()
