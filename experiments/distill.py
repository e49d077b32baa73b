"""Matryoshka neural-collapse distillation against plain MRL on CLINC150 (nbs/studies/05_distill.ipynb), into a
result file.

    MATRYOSHKA_LAB_DATA=../shared/data python experiments/distill.py [--seeds 0 1 2] [--out runs/distill_compare]
                                                                     [--result results/distill/clinc150.json]

Every arm of matryoshka_lab.studies.distill.DISTILL_ARMS (plain MRL with unsupervised SimCSE, distill_nc, distill_nc
with alignment only) trains the embedded all-MiniLM-L6-v2 with configs/distill_nc.yaml's settings for each seed,
measuring k-NN accuracy, the probe's NC1 and the projections' orthonormality at the last layer every 50 steps
(distill_compare); the untrained model is measured once. Run directories go to OUT (a complete one is read back, so an
interrupted run continues); every row, with the config, arms, seeds and the command and commit that made them, is
written to RESULT, which nbs/studies/05_distill.ipynb and RESULTS.md read. A few minutes per arm and seed on 2 CPU
cores.
"""
import argparse
import json
import shlex
import sys
from pathlib import Path

from matryoshka_lab.core import provenance
from matryoshka_lab.studies.distill import DISTILL_ARMS, arm_config, distill_compare, distill_summary

ROOT = Path(__file__).resolve().parents[1]
EVERY = 50                   # configs/distill_nc.yaml's eval_every: NC1 at steps 0, 50, 100, k-NN at 50, 100


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/distill_compare", help="run directories")
    p.add_argument("--result", default="results/distill/clinc150.json", help="the result file")
    args = p.parse_args()
    made = provenance("python experiments/distill.py " + shlex.join(sys.argv[1:]))   # the code that runs: its commit now
    config = ROOT / "configs" / "distill_nc.yaml"
    rows = distill_compare(Path(args.out), seeds=args.seeds, config=config, every=EVERY)
    shared = {k: v for k, v in arm_config("distill_nc", args.out, config=config, every=EVERY).to_dict().items()
              if k not in ("run_dir", "seed", "method", "objective", "loss_options")}
    record = {**made, "config": shared, "arms": DISTILL_ARMS, "seeds": args.seeds, "every": EVERY,
              "rows": json.loads(rows.round(6).to_json(orient="records"))}
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for metric, decimals in (("knn_acc_intent", 1), ("knn_acc_domain", 1), ("nc1", 3)):
        print(distill_summary(rows, metric, decimals).to_string(), "\n")
    print(f"wrote {args.result}")


if __name__ == "__main__":
    main()
