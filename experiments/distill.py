"""Matryoshka neural-collapse distillation against plain MRL on CLINC150 (nbs/studies/05_distill.ipynb), into a
result file.

    MATRYOSHKA_LAB_DATA=../shared/data python experiments/distill.py [--seeds 0 1 2] [--out runs/distill_compare]
        [--result results/distill/clinc150.json] [--config configs/distill_nc.yaml] [--arms mrl distill_nc distill_align]
        [--every 50] [--transfer TASK ...]

Each --arms of matryoshka_lab.studies.distill.DISTILL_ARMS (plain MRL with unsupervised SimCSE, distill_nc, distill_nc
with alignment only, alignment only through free projections) trains the embedded all-MiniLM-L6-v2 with --config's
settings (configs/distill_nc_mpnet.yaml: the stronger all-mpnet-base-v2 as teacher, 400 steps, --every 100) for each
seed, measuring k-NN accuracy, the probe's NC1 and the projections' orthonormality at the last layer every --every
steps (distill_compare); the untrained model is measured once. Run directories go to OUT (a complete one is read back, so an
interrupted run continues); every row, with the config, arms, seeds and the command and commit that made them, is
written to RESULT, which nbs/studies/05_distill.ipynb and RESULTS.md read. A few minutes per arm and seed on 2 CPU
cores. --transfer evaluates the untrained model and every run's exported model on more tasks at the last layer and every
subnet dim (distill_transfer; RESULTS.md uses the MIPIC and MIC papers' kind: banking77 tweeteval_emotion mrpc stsb)
into the same file.
"""
import argparse
import json
import shlex
import sys
from pathlib import Path

from matryoshka_lab.core import provenance
from matryoshka_lab.data import TASKS
from matryoshka_lab.runs import write_json
from matryoshka_lab.studies.baselines import task_metric
from matryoshka_lab.studies.distill import (DISTILL_ARMS, arm_config, distill_compare, distill_summary, distill_transfer,
                                            teacher_nc1, transfer_frame)

ROOT = Path(__file__).resolve().parents[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/distill_compare", help="run directories")
    p.add_argument("--result", default="results/distill/clinc150.json", help="the result file")
    p.add_argument("--config", default=str(ROOT / "configs" / "distill_nc.yaml"), help="the shared settings (a YAML config)")
    p.add_argument("--arms", nargs="+", default=["mrl", "distill_nc", "distill_align"], choices=list(DISTILL_ARMS))
    p.add_argument("--every", type=int, default=50, help="steps between NC1 and k-NN measurements")
    p.add_argument("--transfer", nargs="+", default=[], metavar="TASK", help="more tasks to evaluate every model on (last layer)")
    args = p.parse_args()
    if args.every < 1:
        p.error(f"--every must be a positive number of steps, got {args.every}")
    unknown = [t for t in args.transfer if t not in TASKS]
    if unknown:
        p.error(f"--transfer: unknown task(s) {', '.join(unknown)}; known tasks: {', '.join(TASKS)}")
    made = provenance("python experiments/distill.py " + shlex.join(sys.argv[1:]))   # the code that runs: its commit now
    rows = distill_compare(Path(args.out), seeds=args.seeds, arms=tuple(args.arms), config=args.config, every=args.every)
    shared = arm_config("distill_nc", args.out, config=args.config, every=args.every).to_dict()
    shared = {k: v for k, v in shared.items() if k not in ("run_dir", "seed", "method", "objective")}
    distilled = [a for a in args.arms if DISTILL_ARMS[a]["method"] == "distill_nc"]
    teacher = teacher_nc1(args.out, distilled[0], args.seeds[0]) if distilled else None
    transfer = distill_transfer(args.out, args.transfer, args.seeds, tuple(args.arms), args.config) if args.transfer else None
    record = {**made, "config": shared, "arms": {a: DISTILL_ARMS[a] for a in args.arms}, "seeds": args.seeds, "every": args.every,
              "teacher_nc1": teacher, "rows": json.loads(rows.round(6).to_json(orient="records"))}
    if transfer is not None:
        record["transfer"] = json.loads(transfer.round(6).to_json(orient="records"))
    write_json(args.result, record)
    for metric, decimals in (("knn_acc_intent", 1), ("knn_acc_domain", 1), ("nc1", 3)):
        print(distill_summary(rows, metric, decimals).to_string(), "\n")
    for task in args.transfer:                                    # the papers' metric of each task
        print(task, distill_summary(transfer_frame(transfer, task), task_metric(task)).to_string(), "\n")
    if teacher:
        print(f"the teacher's NC1 on the probe ({teacher['dim']} dims): {teacher['nc1']:.3f}")
    print(f"wrote {args.result}")


if __name__ == "__main__":
    main()
