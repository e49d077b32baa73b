"""CPU-scale comparisons of the training objectives: the baselines (untrained, no-Matryoshka, MRL, 2DMSE, ESE),
MIPIC and MIC with their ablations, and where each one's gradient comes from.

    python experiments/baselines.py [--setting angle|simcse|mipic|cold|angle_mpnet] [--seeds 0 1 2] [--methods ...] [--max-steps N]
                                    [--out DIR] [--results DIR] [--task-share] [--add-tasks TASK ... [--add-layers 3,-1]]

The sweep of nbs/studies/02_baselines.ipynb (matryoshka_lab.studies.baselines) from a shell: every method trains the embedded
all-MiniLM-L6-v2 with the same data, steps, batch, learning rate and seeds, then evaluates it. Settings: angle (AnglE
on STS-B train pairs, lr 5e-5; by default every method: the regime where the task term leads) and simcse
(unsupervised SimCSE on wiki sentences), evaluated at every hidden state x prefix dim on STS-B (dev and test), SICK-R
and STS12-16; mipic (SimCSE on the MIPIC/MIC corpus; by default MRL, MIPIC, MIC, MIPIC without PIC, MIC without SIR,
and beside them base, 2DMSE (both alignments), ESE and MIPIC's earlier detached teacher), evaluated at the last layer
on the STS sets, Banking77, TweetEval and MRPC (nbs/studies/03_mipic_mic.ipynb).
cold: mipic from the embedded model with its top 3 layers re-drawn (a cold start).
angle_mpnet: the angle setting on the second backbone, all-mpnet-base-v2 (requirements/mpnet.txt; 12 layers, dims 16..768),
by default untrained, MRL, 2DMSE and MIC.
Run directories go to OUT (finished runs are read back, so an interrupted sweep continues); the per-seed grids are
merged into the committed result file RESULTS/summary.csv with RESULTS/meta.json (what wrote each method's rows),
and the script prints mean +- std over seeds of the average over the 7 STS test sets.
--task-share trains nothing: it measures the task term's share of each method's gradient on the first batch of
each seed (matryoshka_lab.studies.baselines.task_share) into RESULTS/task_share.csv.
--add-tasks evaluates each run's exported model on more tasks at --add-layers (matryoshka_lab.studies.baselines.add_tasks;
a missing run is trained first) and merges their rows into the result file, e.g. the papers' classification tasks in
the angle setting: --setting angle --add-tasks banking77 tweeteval_emotion mrpc --add-layers 3,-1
"""
import argparse
import shlex
import sys
from pathlib import Path

import pandas as pd

from matryoshka_lab.studies.baselines import (BASELINES, EVERY_METHOD, MIPIC_SETTING_METHODS, MIPIC_SWEEP, SETTINGS, STS_TEST,
                                        VARIANTS, delta_table, run_baselines, save_results, seed_stats, stats_table,
                                        task_share)
from matryoshka_lab.runs import write_atomic

DEFAULT_METHODS = {"mipic": MIPIC_SETTING_METHODS, "cold": MIPIC_SWEEP, "angle": EVERY_METHOD,
                   "angle_mpnet": ("untrained", "mrl", "2dmse", "mic")}   # the second backbone: the findings that test most per hour
DEFAULT_STEPS = {"mipic": 100, "cold": 100}   # what nbs/studies/03 reads: a run of the mipic setting takes about 5 min on 2 CPU cores


def measure_shares(methods, setting: str, seeds, folder: Path) -> pd.DataFrame:
    "The task term's share per variant and seed, merged into FOLDER/task_share.csv (a variant's rows replace its earlier ones)."
    rows = pd.DataFrame([task_share(m, setting, seed) for m in methods if m != "untrained" for seed in seeds])
    path = folder / "task_share.csv"
    if path.is_file():
        old = pd.read_csv(path)
        rows = pd.concat([old[~old.variant.isin(set(rows.variant))], rows], ignore_index=True)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(path, rows.to_csv(index=False, float_format="%.6g"))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(SETTINGS), default="angle")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=None, choices=list(VARIANTS),
                   help="default: every method (angle, mipic), the baselines (simcse) or MRL, MIPIC, MIC and their ablations (cold)")
    p.add_argument("--max-steps", type=int, default=None, help="default: 100 (mipic, cold), 200 (the others)")
    p.add_argument("--out", default=None, help="run directories, default: runs/baselines_SETTING")
    p.add_argument("--results", default=None, help="result folder, default: results/baselines/SETTING")
    p.add_argument("--task-share", action="store_true", help="measure each method's task-term share of the gradient instead")
    p.add_argument("--add-tasks", nargs="+", default=(), metavar="TASK",
                   help="also evaluate each run (trained first if it is missing) on these tasks, at --add-layers")
    p.add_argument("--add-layers", default="-1", help="hidden states for --add-tasks: a comma list, -1 the last (default)")
    args = p.parse_args()
    methods = list(args.methods or DEFAULT_METHODS.get(args.setting, BASELINES))
    max_steps = args.max_steps or DEFAULT_STEPS.get(args.setting, 200)
    results = Path(args.results or f"results/baselines/{args.setting}")
    command = "python experiments/baselines.py " + shlex.join(sys.argv[1:])
    if args.task_share:
        shares = measure_shares(methods, args.setting, args.seeds, results)
        print(shares.groupby("variant", sort=False)[["task_share", "cos_task_total"]].agg(["mean", "min", "max"]).round(4).to_string())
        return
    summary = run_baselines(args.out or f"runs/baselines_{args.setting}", args.setting, seeds=args.seeds,
                            methods=methods, max_steps=max_steps, more_tasks=args.add_tasks, more_layers=args.add_layers)
    save_results(summary, results, args.setting, command, max_steps, added_tasks=args.add_tasks)
    stats = seed_stats(summary, STS_TEST)
    for method in methods:
        print(f"\n{method}: mean over {len(STS_TEST)} STS test sets, Spearman x100, mean +- std over seeds {args.seeds}")
        print(stats_table(stats, method).to_string())
    if "mrl" in methods:
        for method in [m for m in methods if m not in ("mrl", "untrained")]:
            print(f"\n{method} - mrl (mean over seeds)")
            print(delta_table(stats, method).round(2).to_string())


if __name__ == "__main__":
    main()
