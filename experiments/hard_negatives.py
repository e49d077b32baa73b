"""MRL with and without hard negatives, with and without the duplicate-free draw, on CLINC150 pairs: a CPU-scale study.

    python experiments/hard_negatives.py [--data-dir DIR] [--seeds 0 1 2] [--steps 150] [--runs runs/hard_negatives]
                                         [--out results/own_data/hard_negatives.json]

The training pairs are written as a JSONL file and trained on by path, as a user's own file would be. FAQ-style:
each CLINC150 intent's first 3 training utterances are its answers; every other training utterance is an anchor
whose positive is one of its intent's answers and whose hard negative is an answer of a sibling intent (another
intent of the same domain), both drawn from a fixed seed. Many anchors share an answer, so a plain batch of 32 often
holds one text twice: a false negative the duplicate-free draw keeps out.

Four conditions, each MRL (InfoNCE at temperature 0.05, dims 16..384, the mean over dims) from the embedded
all-MiniLM-L6-v2, the same seeds, steps, batch and learning rate: in-batch negatives only or with the hard-negative
column, by the plain draw or the duplicate-free one. Scored at the last layer and every dim on clinc150_intents
(its test utterances retrieving training utterances of their intent) and banking77_intents (another domain), nDCG@10,
beside the untrained model. Paired t-tests over seeds of each condition against the plain in-batch run, Holm over
each task's family (3 conditions x 6 dims). Runs go to --runs (a finished run is read back, so an interrupted study
continues); the result file records the command and the code's commit.
"""
import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from matryoshka_lab.config import make_config
from matryoshka_lab.core import provenance, resolve_data_dir
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import evaluate
from matryoshka_lab.methods import BatchDraw, TrainData
from matryoshka_lab.runs import write_json
from matryoshka_lab.stats import holm, paired_ttest
from matryoshka_lab.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("clinc150_intents", "banking77_intents")
DIMS = (16, 32, 64, 128, 256, 384)
CONDITIONS = {   # name -> (hard negatives, duplicate-free draw)
    "in-batch, plain draw": (False, False),
    "in-batch, no duplicates": (False, True),
    "hard negative, plain draw": (True, False),
    "hard negative, no duplicates": (True, True),
}
REFERENCE = "in-batch, plain draw"


def write_pairs(data_dir: Path, out: Path, answers: int = 3, seed: int = 0) -> Path:
    "The FAQ-style pairs file (anchor, positive, negative) from CLINC150's training split."
    df = pd.read_json(data_dir / "clinc150" / "train.jsonl", lines=True)
    rng = np.random.default_rng(seed)
    faq = {intent: list(g.text[:answers]) for intent, g in df.groupby("intent", sort=True)}
    siblings = {intent: sorted(set(g.intent) - {intent}) for _, g in df.groupby("domain") for intent in set(g.intent)}
    rows = []
    for intent, g in df.groupby("intent", sort=True):
        for text in g.text[answers:]:
            other = siblings[intent][rng.integers(len(siblings[intent]))]
            rows.append({"anchor": text, "positive": faq[intent][rng.integers(answers)],
                         "negative": faq[other][rng.integers(answers)]})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out


def repeat_share(pairs: Path, batch_size: int, seed: int, batches: int) -> dict:
    "How often the plain draw's first `batches` batches hold a text twice (in-batch pairs, and with the negative)."
    df = pd.read_json(pairs, lines=True)
    out = {}
    for name, negatives in (("in-batch", ()), ("hard negative", (list(df.negative),))):
        data = TrainData(list(df.anchor), list(df.positive), negatives=negatives)
        draw = BatchDraw(data, batch_size, seed, no_duplicates=False)
        repeated = [len(texts) > len(set(texts)) for texts in
                    ([t for i in draw(k) for t in sorted(data.row_texts(i))] for k in range(batches))]
        out[name] = float(np.mean(repeated))
    return out


def run_condition(pairs: Path, run_dir: Path, negatives: bool, no_duplicates: bool, seed: int, steps: int,
                  data_dir: Path) -> pd.DataFrame:
    "One training run's last-layer grid (read back when the run has finished before)."
    grid = run_dir / "grid.csv"
    if not grid.is_file():
        cfg = make_config({"model": "embedded", "method": "mrl", "objective": "infonce", "train_task": str(pairs),
                           "columns": {} if negatives else {"negative": ""}, "no_duplicates": no_duplicates,
                           "dims": list(DIMS), "max_steps": steps, "batch_size": 32, "max_length": 32, "lr": 3e-5,
                           "seed": seed, "run_dir": str(run_dir), "data_dir": str(data_dir), "checkpoint_every": 0,
                           "eval_every": 0, "eval_tasks": list(TASKS), "eval_layers": "-1"})
        Trainer(cfg, progress=False).fit()
    return pd.read_csv(grid)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--runs", default=str(ROOT / "runs" / "hard_negatives"))
    p.add_argument("--out", default=str(ROOT / "results" / "own_data" / "hard_negatives.json"))
    args = p.parse_args()
    made = provenance("python experiments/hard_negatives.py " + shlex.join(sys.argv[1:]))
    data_dir = resolve_data_dir(args.data_dir)
    if data_dir is None:
        sys.exit("error: give --data-dir or set $MATRYOSHKA_LAB_DATA (CLINC150 and Banking77 are read from it)")
    runs = Path(args.runs)
    pairs = write_pairs(data_dir, runs / "clinc150_faq_pairs.jsonl")

    untrained = evaluate(Encoder.from_pretrained("embedded"), list(TASKS), layers="-1", dims=list(DIMS),
                         data_dir=data_dir, progress=False)
    rows = []
    for seed in args.seeds:
        for name, (negatives, no_dup) in CONDITIONS.items():
            slug = name.replace(", ", "_").replace(" ", "-")
            grid = run_condition(pairs, runs / f"{slug}_s{seed}", negatives, no_dup, seed, args.steps, data_dir)
            metrics = [json.loads(line) for line in (runs / f"{slug}_s{seed}" / "metrics.jsonl").read_text().splitlines()]
            deferred = sum(m["value"] for m in metrics if m.get("name") == "deferred")
            for r in grid[grid.metric == "ndcg_at_10"].itertuples():
                rows.append({"condition": name, "seed": seed, "task": r.task, "dim": int(r.dim), "value": float(r.value),
                             "deferred_rows": int(deferred)})
            print(f"seed {seed} {name}: " + ", ".join(
                f"{t} d384 {grid[(grid.task == t) & (grid.metric == 'ndcg_at_10') & (grid.dim == 384)].value.item():.4f}"
                for t in TASKS), flush=True)
    scores = pd.DataFrame(rows)

    tests = []
    for task in TASKS:
        family = {}
        ref = scores[(scores.condition == REFERENCE) & (scores.task == task)].set_index(["dim", "seed"]).value
        for name in CONDITIONS:
            if name == REFERENCE:
                continue
            cur = scores[(scores.condition == name) & (scores.task == task)].set_index(["dim", "seed"]).value
            for d in DIMS:
                t = paired_ttest(cur[d].sort_index().values, ref[d].sort_index().values)
                family[f"{name} d{d}"] = (name, d, t)
        adj = holm({k: t["p"] for k, (_, _, t) in family.items()})
        for key, (name, d, t) in family.items():
            tests.append({"task": task, "condition": name, "dim": d, "mean_diff": t["mean_diff"], "sd_diff": t["sd_diff"],
                          "t": t["t"], "df": t["df"], "p": t["p"], "p_holm": float(adj.loc[key, "p_adj"])})
    summary = scores.groupby(["condition", "task", "dim"]).value.agg(["mean", "std"]).reset_index()
    base = untrained[untrained.metric == "ndcg_at_10"][["task", "dim", "value"]]
    record = {**made, "model": "embedded", "steps": args.steps, "batch_size": 32, "seeds": args.seeds,
              "pairs": {"rows": sum(1 for _ in open(pairs, encoding="utf-8")), "answers_per_intent": 3},
              "plain_batches_with_a_repeated_text": repeat_share(pairs, 32, args.seeds[0], 200),
              "untrained": base.to_dict("records"), "scores": scores.to_dict("records"),
              "summary": summary.to_dict("records"), "tests": tests}
    write_json(Path(args.out), record)
    pd.set_option("display.width", 200)
    print(summary.pivot_table(index=["task", "condition"], columns="dim", values="mean").round(4).to_string())
    print(pd.DataFrame(tests).round(4).to_string())
    print(f"Wrote {args.out}")


if __name__ == "__main__":
    main()
