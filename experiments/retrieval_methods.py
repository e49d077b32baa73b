"""Which training keeps most at a budget: every method of the AnglE setting evaluated on retrieval tasks at the last
layer, every prefix dim and stored precision.

    python experiments/retrieval_methods.py [--seeds 0 1 2] [--methods untrained base mrl 2dmse ese mipic mic]
                                            [--tasks arxiv_title_abstract stsb_paraphrase banking77_intents]
                                            [--precisions float32,binary,binary+rescore] [--out runs/baselines_angle]
                                            [--results results/baselines/angle_retrieval]

Each run is the one experiments/baselines.py --setting angle trains (matryoshka_lab.studies.baselines.run_one: the
embedded model, AnglE on STS-B train pairs, 200 steps; a finished run in OUT is read back, so an interrupted sweep
continues). Its exported model is evaluated on --tasks at the last hidden state, at the run's dims and every
--precisions (matryoshka_lab.eval.evaluate), and those rows alone are merged into RESULTS/summary.csv with
RESULTS/meta.json (studies.baselines.save_results: what wrote each run) after every run. RESULTS/reproduction.csv
says, per run, how far its STS test scores are from the committed ones of results/baselines/angle (the same method and
seed trained again: the largest absolute difference, Spearman x100). Jobs go seed by seed, so a stopped sweep leaves
whole seeds.
"""
import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd

from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import evaluate, parse_precisions
from matryoshka_lab.runs import write_atomic
from matryoshka_lab.studies.baselines import STS_TEST, baseline_config, read_results, run_one, save_results
from matryoshka_lab.recipe import load_encoder

METHODS = ("untrained", "base", "mrl", "2dmse", "ese", "mipic", "mic")
TASKS = ("arxiv_title_abstract", "stsb_paraphrase", "banking77_intents")
STEPS = 200


def reproduction(grid: pd.DataFrame, committed: pd.DataFrame, method: str, seed: int) -> dict:
    "The largest absolute difference between a run's STS test scores and the committed ones of the same method and seed."
    key = ["task", "layer", "dim", "metric"]
    old = committed[(committed.method == method) & (committed.seed == seed) & committed.task.isin(STS_TEST)]
    both = grid[grid.task.isin(STS_TEST)].merge(old[key + ["value"]], on=key, suffixes=("", "_committed"))
    diff = (both.value - both.value_committed).abs()
    return {"method": method, "seed": seed, "cells": len(both),
            "max_abs_diff": round(float(diff.max()), 4) if len(both) else None}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--tasks", nargs="+", default=list(TASKS))
    p.add_argument("--precisions", default="float32,binary,binary+rescore")
    p.add_argument("--out", default="runs/baselines_angle")
    p.add_argument("--results", default="results/baselines/angle_retrieval")
    p.add_argument("--committed", default="results/baselines/angle", help="the committed STS results to compare runs with")
    args = p.parse_args()
    try:
        precisions = parse_precisions(args.precisions)
    except ValueError as err:
        p.error(str(err))
    command = "python experiments/retrieval_methods.py " + shlex.join(sys.argv[1:])
    committed, _ = read_results(args.committed)
    results = Path(args.results)
    frames, checks = [], []
    jobs = [(m, s) for s in args.seeds for m in args.methods if m != "untrained" or s == args.seeds[0]]
    for n, (method, seed) in enumerate(jobs, 1):
        print(f"[{n}/{len(jobs)}] {method} seed {seed}", flush=True)
        grid = run_one(method, seed, args.out, "angle", progress=True)
        checks.append(reproduction(grid, committed, method, seed))
        print(f"  STS test against the committed run: {checks[-1]}", flush=True)
        run_dir = Path(args.out) / f"{method}_seed{seed}"
        cfg = baseline_config(method, seed, run_dir, "angle")
        encoder = load_encoder(cfg) if method == "untrained" else Encoder.from_pretrained(str(run_dir / "model"), pooling=cfg.pooling)
        rows = evaluate(encoder, args.tasks, layers="-1", dims=list(cfg.eval_dims or cfg.dims), data_dir=cfg.data_dir,
                        precisions=precisions)
        frames.append(rows.assign(method=method, seed=seed, setting="angle"))
        save_results(pd.concat(frames, ignore_index=True), results, "angle", command, STEPS)
        old = pd.read_csv(results / "reproduction.csv") if (results / "reproduction.csv").is_file() else None
        new = pd.DataFrame(checks)
        if old is not None:
            old = old[[(m, s) not in {(c["method"], c["seed"]) for c in checks} for m, s in zip(old.method, old.seed)]]
        write_atomic(results / "reproduction.csv", pd.concat([old, new], ignore_index=True).to_csv(index=False))
        last = rows[(rows.metric == "ndcg_at_10")].groupby("dim").value.mean()
        print(f"  nDCG@10 float32, mean over {len(args.tasks)} tasks by dim: {last.round(2).to_dict()}", flush=True)


if __name__ == "__main__":
    main()
