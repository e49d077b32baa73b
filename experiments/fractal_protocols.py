"""Fractal Embeddings under the two protocols, and the differences between them one at a time (nbs/18_fractal.ipynb; results: nbs/studies/04_fractal.ipynb).

    python experiments/fractal_protocols.py main      # CLINC, 5 seeds: every condition under both protocols
    python experiments/fractal_protocols.py toggles   # CLINC, 3 seeds, V5 (and MRL) with each difference toggled alone
    python experiments/fractal_protocols.py toggles --only 'toggle_paper-text+metric_terms'   # one of them
    python experiments/fractal_protocols.py main --dataset trec --only authors --workers 2     # Table 3's other datasets
    python experiments/fractal_protocols.py main --model mpnet --only authors   # the second backbone: authors_mpnet.json
    python experiments/fractal_protocols.py more [--dataset clinc150]   # authors: three levels, synthetic K0, capacity, lr
    python experiments/fractal_protocols.py hierarchy --dataset trec      # add H(L0), H(L1|L0) to files written before
                                                                        # run_fractal recorded them

Writes small JSON result files under results/fractal/ (re-running replaces a file; an existing file is skipped unless
--force). Reads the datasets from $MATRYOSHKA_LAB_DATA (or --data-dir); the backbone vectors come from encode_cached.
"""
import argparse
import json
import os
import time
from pathlib import Path

from matryoshka_lab.data import load_task
from matryoshka_lab.fractal_runner import (CLINC_SUPER_DOMAINS, add_parent_level, encode_levels, fractal_data,
                                           hierarchy_bits, run_fractal, synthetic_sweep)
from matryoshka_lab.runs import write_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "fractal"
K0S = (2, 3, 5, 10, 15, 25, 50, 75)                 # Table 5
BLOCKS = (16, 32, 48, 64, 96, 128)                  # Fig. 6: d_s, four blocks each (projection width 4 d_s)
METRIC_TERMS = {"contrastive_weight": 1.0, "margin_weight": 0.5}

# one difference at a time: (name, the options that differ) -- applied to paper-text ("+") and removed from authors ("-")
DIFFERENCES = {
    "metric terms": (METRIC_TERMS, {"contrastive_weight": 0.0, "margin_weight": 0.0}),
    "prefix labels": ({"prefix_labels": "first"}, {"prefix_labels": "paper"}),
    "network head": ({"body": "authors"}, {"body": "linear"}),
    "normalisation": ({"normalise": "authors"}, {"normalise": "none"}),
    "prefix sampling": ({"prefix_sampling": "example_mode"}, {"prefix_sampling": "batch"}),
    "block dropout": ({"block_dropout": "full"}, {"block_dropout": "all"}),
    "schedule": ({"schedule": "constant"}, {"schedule": "cosine"}),
    "drop last": ({"drop_last": True}, {"drop_last": False}),
    "selection": ({"selection": "loo"}, {"selection": "train_index"}),
    "split": ({"split_seed": 0, "val_frac": 0.15}, {"split_seed": None, "val_frac": 0.1}),
}


def save(path: Path, res: dict, seconds: float, command: str) -> None:
    "Write a result with the wall time and the command that made it; print each condition's S (headline, then every evaluation)."
    res = {**res, "seconds": round(seconds, 1), "command": command}
    write_json(path, res, allow_nan=False)
    s = res["summary"]
    print(f"{path.stem}: " + "  ".join(f"{c} S {v['S_mean']:+.3f} " + "/".join(f"{x:+.3f}" for x in v["S_mean_by_eval"].values())
                                  for c, v in s.items()) + f"  ({seconds:.0f} s)", flush=True)


def save_rows(path: Path, rows: list, seconds: float, command: str, **info) -> None:
    "Write a sweep (one row per run) with the wall time and the command that made it."
    write_json(path, {**info, "rows": rows, "seconds": round(seconds, 1), "command": command}, allow_nan=False)
    print(f"{path.stem}: {len(rows)} runs ({seconds:.0f} s)", flush=True)


def capacity_rows(data, workers: int) -> list:
    "Fig. 6 under the authors' protocol: V5 and MRL, 3 seeds, for every block size d_s."
    rows = []
    for d in BLOCKS:
        res = run_fractal("embedded", None, data, seeds=3, conditions=("v5", "mrl"), dim=4 * d, progress=False, workers=workers)
        rows += [{"d_s": d, "seed": r["seed"], "condition": r["condition"], "S": r["S"], **{f"S[{ev}]": v for ev, v in r["S_by_eval"].items()}}
                 for r in res["runs"]]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", choices=("main", "toggles", "more", "hierarchy"))
    p.add_argument("--data-dir", default=os.environ.get("MATRYOSHKA_LAB_DATA"))
    p.add_argument("--dataset", default="clinc150")
    p.add_argument("--only", default=None, help="comma-separated result names to run (default: all of the study)")
    p.add_argument("--force", action="store_true", help="recompute result files that exist")
    p.add_argument("--workers", type=int, default=1, help="heads trained at a time, one process each (default 1)")
    p.add_argument("--model", default="embedded", help="the frozen backbone (main study only); another than embedded "
                   "writes NAME_MODEL.json")
    args = p.parse_args()
    if args.model != "embedded" and args.study != "main":
        p.error(f"--model {args.model} applies to the main study only")
    suffix = "" if args.model == "embedded" else f"_{args.model}"
    if args.study == "hierarchy":                                  # labels only: nothing to encode
        task = load_task(args.dataset, args.data_dir)
        train_y, _, levels, _ = encode_levels(task.train, task.test)
        add_hierarchy(OUT / args.dataset, train_y, levels,
                      f"python experiments/fractal_protocols.py hierarchy --dataset {args.dataset}")
        return
    data = fractal_data(args.model, args.dataset, args.data_dir, progress=False)
    jobs = {}
    if args.study == "main":
        jobs["authors"] = dict(protocol="authors", seeds=5, conditions=("v5", "mrl"))
        for c in ("inverted", "no_prefix", "uhmt"):                 # one file each, so that they can run side by side
            jobs[f"authors_{c}"] = dict(protocol="authors", seeds=5, conditions=(c,))
        jobs["paper-text"] = dict(protocol="paper-text", seeds=5)
    elif args.study == "toggles":
        three = dict(seeds=3, conditions=("v5",))                  # the two protocols themselves: the main study's first 3 seeds
        for name, (add, remove) in DIFFERENCES.items():
            key = name.replace(" ", "_")
            jobs[f"toggle_paper-text+{key}"] = dict(protocol="paper-text", **three, **add)
            jobs[f"toggle_authors-{key}"] = dict(protocol="authors", **three, **remove)
        jobs["toggle_paper-text+metric_terms+prefix_labels"] = dict(protocol="paper-text", **three, prefix_labels="first", **METRIC_TERMS)
        jobs["toggle_mrl_paper-text+metric_terms"] = dict(protocol="paper-text", seeds=3, conditions=("mrl",), **METRIC_TERMS)
    only = set(args.only.split(",")) if args.only else None
    if args.study == "more":
        more(args, data, only)
        return
    for name, kw in jobs.items():
        path = OUT / args.dataset / f"{name}{suffix}.json"
        if (only and name not in only) or (path.exists() and not args.force):
            continue
        t = time.time()
        res = run_fractal(args.model, args.data_dir, data, progress=False, workers=args.workers, **kw)
        model = f" --model {args.model}" if suffix else ""
        save(path, res, time.time() - t, f"python experiments/fractal_protocols.py {args.study} --dataset {args.dataset}{model} --only {name}")



def add_hierarchy(folder: Path, train_y, levels, command: str) -> None:
    "Write hierarchy_bits(train_y) (what run_fractal now records) into every run_fractal result in folder that lacks it."
    for path in sorted(folder.glob("*.json")):
        res = json.loads(path.read_text())
        if "summary" in res and "hierarchy" not in res and res["levels"] == list(levels):
            res["hierarchy"] = {**hierarchy_bits(train_y), "command": command}
            write_json(path, res, allow_nan=False)
            print(f"{path.relative_to(ROOT)}: H(L1|L0) = {res['hierarchy']['H_L1_given_L0']:.2f} bits")


def more(args, data, only) -> None:
    "The rest of the study under the authors' protocol: three levels and lr (CLINC), synthetic K0 (CLINC), capacity (any)."
    out, cmd = OUT / args.dataset, f"python experiments/fractal_protocols.py more --dataset {args.dataset} --only "
    todo = lambda name: (not only or name in only) and (args.force or not any(out.glob(f"{name}.json")))
    if args.dataset == "clinc150":
        if todo("authors_3level"):
            t = time.time()
            three = add_parent_level(fractal_data("embedded", "clinc150", args.data_dir, levels="all", progress=False),
                                     CLINC_SUPER_DOMAINS, "super_domain")
            res = run_fractal("embedded", None, three, seeds=5, conditions=("v5", "mrl"), progress=False, workers=args.workers)
            save(out / "authors_3level.json", res, time.time() - t, cmd + "authors_3level")
        for lr in (1e-3, 1e-2):
            name = f"authors_lr{lr:.0e}"
            if todo(name):
                t = time.time()
                res = run_fractal("embedded", None, data, seeds=5, conditions=("v5", "mrl"), lr=lr, progress=False, workers=args.workers)
                save(out / f"{name}.json", res, time.time() - t, cmd + name)
        if todo("authors_synthetic"):
            t = time.time()
            df = synthetic_sweep(data, K0S, seeds=3, progress=False, workers=args.workers)
            save_rows(out / "authors_synthetic.json", df.to_dict(orient="records"), time.time() - t, cmd + "authors_synthetic",
                      protocol="authors", k0s=list(K0S))
    if todo("authors_capacity"):
        t = time.time()
        save_rows(out / "authors_capacity.json", capacity_rows(data, args.workers), time.time() - t, cmd + "authors_capacity",
                  protocol="authors", block_dims=list(BLOCKS))


if __name__ == "__main__":
    main()
