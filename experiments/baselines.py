"""CPU-scale comparison of the baseline objectives (issue 3): untrained, no-Matryoshka, MRL, 2DMSE and ESE.

    python experiments/baselines.py [--setting simcse|angle] [--seeds 0 1 2] [--max-steps 200] [--out DIR]

Every method trains the embedded all-MiniLM-L6-v2 with the same data, steps, batch, learning rate and seeds
(configs/{base,mrl,2dmse,ese}.yaml plus the setting's overrides), then evaluates every hidden state x prefix dim on
STS-B (dev and test), SICK-R and STS12-16 (Spearman x100). Settings:

- simcse: unsupervised SimCSE on the wiki sentences (the MIPIC / MIC papers' task loss);
- angle: AnglE on the scored STS-B train pairs at lr 5e-5 (2DMSE's loss and learning rate; the paper trains on
  MultiNLI + SNLI, which is not available here).

Writes OUT/summary.csv (method, seed, task, layer, dim, metric, value) after every run, so an interrupted sweep
keeps what finished (finished runs are read back, not retrained), and prints mean +- std over seeds of the
average over the 7 test STS sets, per layer and dim. nbs/10_baselines.ipynb reads summary.csv.
"""
import argparse
from pathlib import Path

import pandas as pd

from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import evaluate
from matryoshka_lab.trainer import Trainer, load_config

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["untrained", "base", "mrl", "2dmse", "ese"]
STS = ["stsb", "sickr", "sts12", "sts13", "sts14", "sts15", "sts16"]
SETTINGS = {"simcse": [],
            "angle": ["objective=angle", "train_task=stsb", "max_length=48", "lr=5e-5"]}


def run_grid(method: str, seed: int, run_dir: Path, overrides: list[str]) -> pd.DataFrame:
    "The layer x dim grid of one method and seed: read back when the run finished before, else trained now."
    grid_csv = run_dir / "grid.csv"
    if grid_csv.is_file() and (method == "untrained" or (run_dir / "model").is_dir()):
        return pd.read_csv(grid_csv)
    cfg = load_config(ROOT / "configs" / f"{'base' if method == 'untrained' else method}.yaml",
                      [f"seed={seed}", f"run_dir={run_dir}", *overrides])
    print(f"== {method} seed {seed} -> {run_dir}", flush=True)
    if method == "untrained":
        df = evaluate(Encoder.from_pretrained(cfg.model, pooling=cfg.pooling), list(cfg.eval_tasks), layers="all",
                      dims=list(cfg.dims), data_dir=cfg.data_dir, progress=False)
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        Trainer(cfg, progress=False).fit()
        df = pd.read_csv(grid_csv)
    df.to_csv(grid_csv, index=False)
    return df


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(SETTINGS), default="simcse")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--out", default=None, help="default: runs/baselines_SETTING")
    args = p.parse_args()
    out = Path(args.out or f"runs/baselines_{args.setting}")
    overrides = SETTINGS[args.setting] + [f"max_steps={args.max_steps}", "eval_every=0", "checkpoint_every=0",
                                          f"eval_tasks=[{','.join(['stsb_dev'] + STS)}]"]
    frames = []
    for seed in args.seeds:
        for method in args.methods:
            if method == "untrained" and seed != args.seeds[0]:
                continue                      # no training: the same numbers for every seed
            grid = run_grid(method, seed, out / f"{method}_seed{seed}", overrides)
            frames.append(grid.assign(method=method, seed=seed, setting=args.setting))
            pd.concat(frames).to_csv(out / "summary.csv", index=False)
    df = pd.concat(frames)
    df = df[(df.metric == "spearman") & df.task.isin(STS)]
    avg = df.groupby(["method", "seed", "layer", "dim"]).value.mean().reset_index()
    stats = avg.groupby(["method", "layer", "dim"]).value.agg(["mean", "std"]).reset_index()
    for method in args.methods:
        tab = stats[stats.method == method]
        cell = tab.assign(s=[f"{m:.2f}+-{s:.2f}" for m, s in zip(tab["mean"], tab["std"].fillna(0))])
        print(f"\n{method}: mean over {len(STS)} STS test sets, Spearman x100, mean+-std over seeds {args.seeds}")
        print(cell.pivot(index="layer", columns="dim", values="s").to_string())


if __name__ == "__main__":
    main()
