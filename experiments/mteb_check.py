"""A packaged model's MTEB scores reproduced by our evaluator: the last layer at full width against the published ones.

    python experiments/mteb_check.py --model mpnet [--data-dir DIR] [--out results/eval/mteb_mpnet.json]

--model is a packaged model of matryoshka_lab.eval.MTEB_PUBLISHED ('embedded': all-MiniLM-L6-v2; 'mpnet':
all-mpnet-base-v2, `requirements/mpnet.txt`). Each published task (STS Spearman x100; for the embedded model also SICK-R and
Banking77) is scored by matryoshka_lab.eval.evaluate at the last hidden state, all dims, the model's own pooling and
max length. Writes one JSON file: what made it, the model's fingerprint and shape, each task's ours / published /
difference and the largest |difference| over the STS tasks (reads the datasets from $MATRYOSHKA_LAB_DATA or
--data-dir).
"""
import argparse
import shlex
import sys
import time
from pathlib import Path

from matryoshka_lab.core import provenance
from matryoshka_lab.encoder import Encoder, model_fingerprint
from matryoshka_lab.eval import MTEB_PUBLISHED, evaluate
from matryoshka_lab.runs import write_json

ROOT = Path(__file__).resolve().parents[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mpnet", choices=sorted(MTEB_PUBLISHED))
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="default: results/eval/mteb_MODEL.json")
    args = p.parse_args()
    out = Path(args.out or ROOT / "results" / "eval" / f"mteb_{args.model}.json")
    made = provenance("python experiments/mteb_check.py " + shlex.join(sys.argv[1:]))
    name, published = MTEB_PUBLISHED[args.model]
    t0 = time.perf_counter()
    enc = Encoder.from_pretrained(args.model)
    tasks = sorted({t for t, _ in published})
    ours = evaluate(enc, tasks, layers="-1", dims=str(enc.hidden_size), data_dir=args.data_dir).set_index(["task", "metric"]).value
    rows = [{"task": task, "metric": metric, "published": ref, "ours": round(float(ours[task, metric]), 4),
             "diff": round(float(ours[task, metric]) - ref, 4)} for (task, metric), ref in published.items()]
    sts = [abs(r["diff"]) for r in rows if r["metric"] == "spearman"]
    record = {**made, "model": args.model, "name": name, "fingerprint": model_fingerprint(args.model),
              "layers": enc.num_layers, "hidden_size": enc.hidden_size, "pooling": enc.pooling, "max_length": enc.max_length,
              "rows": rows, "sts_max_abs_diff": round(max(sts), 4)}
    for r in rows:
        print(f"{r['task']:10s} {r['metric']:9s} ours {r['ours']:6.2f}  MTEB {r['published']:6.2f}  diff {r['diff']:+.2f}")
    print(f"largest |ours - MTEB| over the STS tasks: {record['sts_max_abs_diff']}; {time.perf_counter() - t0:.0f} s")
    write_json(out, record)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
