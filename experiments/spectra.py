"""Per-dimension variance spectra of trained models' last-layer embeddings: MRL against MIC (RESULTS.md's figure).

    MATRYOSHKA_LAB_DATA=../shared/data python experiments/spectra.py --runs RUNS [--out results/eval/spectra.json]

RUNS is the output folder of `python experiments/baselines.py --setting mipic --out RUNS` (METHOD_seedS/model holds
each trained model; `untrained` is the embedded model itself). Every model encodes the same sentences (the distinct
sentences of the STS-B test split, the first --n of them), mean-pooled at the last layer, and the variance of each
of the 384 dimensions over them (diagnostics.dim_variance) is written with the run configs and what made the file.
"""
import argparse
import json
import shlex
import sys
from pathlib import Path

from matryoshka_lab.core import provenance
from matryoshka_lab.data import load_task
from matryoshka_lab.diagnostics import dim_variance
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.runs import write_json

ROOT = Path(__file__).resolve().parents[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, type=Path, help="a baselines output folder with METHOD_seedS/model")
    p.add_argument("--methods", nargs="+", default=["untrained", "mrl", "mic"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", default="stsb")
    p.add_argument("--n", type=int, default=2000, help="sentences encoded (default 2000)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "eval" / "spectra.json")
    args = p.parse_args()
    made = provenance("python experiments/spectra.py " + shlex.join(sys.argv[1:]))
    test = load_task(args.task, args.data_dir).test
    texts = list(dict.fromkeys([*test.sentence1, *test.sentence2]))[:args.n]
    models = {}
    for method in args.methods:
        run = args.runs / f"{method}_seed{args.seed}"
        if method == "untrained":
            path, config = "embedded", {"method": "untrained"}
        else:
            if not (run / "model").is_dir():
                sys.exit(f"no trained model in {run / 'model'}: run experiments/baselines.py first")
            path, full = run / "model", json.loads((run / "config.json").read_text())
            config = {k: full[k] for k in ("method", "loss_options", "objective", "train_task", "max_steps", "lr", "seed")}
        enc = Encoder.from_pretrained(str(path))
        x = enc.encode(texts, layers="-1", desc=method)[0]
        models[method] = {"config": config, "variance": [round(float(v), 8) for v in dim_variance(x)]}
        v = models[method]["variance"]
        print(f"{method}: total variance {sum(v):.4f}; first 16 dims {sum(v[:16]) / sum(v):.1%} of it")
    record = {**made, "task": args.task, "sentences": len(texts), "layer": "last", "pooling": "the model's (mean)",
              "seed": args.seed, "models": models}
    write_json(args.out, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
