"""CPU-scale comparisons of the training objectives: the baselines (untrained, no-Matryoshka, MRL, 2DMSE, ESE) and
MRL vs MIPIC vs MIC with their ablations.

    python experiments/baselines.py [--setting angle|simcse|mipic] [--seeds 0 1 2] [--max-steps N] [--out DIR]

The sweep of nbs/10_baselines.ipynb (matryoshka_lab.experiments) from a shell: every method trains the embedded
all-MiniLM-L6-v2 with the same data, steps, batch, learning rate and seeds, then evaluates it. Settings: angle (AnglE
on STS-B train pairs, lr 5e-5) and simcse (unsupervised SimCSE on wiki sentences), evaluated at every hidden state x
prefix dim on STS-B (dev and test), SICK-R and STS12-16; mipic (SimCSE on the MIPIC/MIC corpus; by default MRL, MIPIC,
MIC, MIPIC without PIC and MIC without SIR), evaluated at the last layer on the STS sets, Banking77, TweetEval and
MRPC, and read by nbs/13_mipic_mic_results.ipynb. Writes OUT/summary.csv after every run (finished runs are read back,
so an interrupted sweep continues) and prints mean +- std over seeds of the average over the 7 STS test sets.
"""
import argparse

from matryoshka_lab.experiments import (BASELINES, MIPIC_SWEEP, SETTINGS, STS_TEST, VARIANTS, delta_table, run_baselines,
                                        seed_stats, stats_table)

DEFAULT_METHODS = {"mipic": MIPIC_SWEEP}
DEFAULT_STEPS = {"mipic": 100}   # what nbs/13 reads: 16 runs of the mipic setting fit one session on 2 CPU cores


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(SETTINGS), default="angle")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=None, choices=list(VARIANTS),
                   help="default: the baselines (angle, simcse) or MRL, MIPIC, MIC and their ablations (mipic)")
    p.add_argument("--max-steps", type=int, default=None, help="default: 100 (mipic), 200 (angle, simcse)")
    p.add_argument("--out", default=None, help="default: runs/baselines_SETTING")
    args = p.parse_args()
    args.methods = args.methods or list(DEFAULT_METHODS.get(args.setting, BASELINES))
    args.max_steps = args.max_steps or DEFAULT_STEPS.get(args.setting, 200)
    summary = run_baselines(args.out or f"runs/baselines_{args.setting}", args.setting, seeds=args.seeds,
                            methods=args.methods, max_steps=args.max_steps)
    stats = seed_stats(summary, STS_TEST)
    for method in args.methods:
        print(f"\n{method}: mean over {len(STS_TEST)} STS test sets, Spearman x100, mean +- std over seeds {args.seeds}")
        print(stats_table(stats, method).to_string())
    if "mrl" in args.methods:
        for method in [m for m in args.methods if m not in ("mrl", "untrained")]:
            print(f"\n{method} - mrl (mean over seeds)")
            print(delta_table(stats, method).round(2).to_string())


if __name__ == "__main__":
    main()
