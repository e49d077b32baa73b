"""The field's references on a setting's evaluation: the untrained model's PCA, random rotation, Matryoshka-Adaptor
(unsupervised, supervised) and CSR, and trained runs' own PCA, beside the methods of results/baselines/NAME.

    python experiments/references.py [--setting angle] [--name NAME] [--tasks TASK ...] [--layers all]
                                     [--precisions float32] [--max-length N] [--seeds 0 1 2] [--runs OUT --trained METHOD ... [--trained-only]]
                                     [--mrpc-beir DIR] [--data-dir DIR] [--results results/references]

Every reference is fitted on the setting's train task (STS-B train for angle) less every text the evaluation scores
(matryoshka_lab.references.fit_set), at the hidden states of --layers (PCA, random: each; the adaptors and CSR: the
last), with each seed of --seeds (PCA has no seed: its rows are the same each time), then scored on --tasks (default:
the setting's evaluation tasks) at the setting's prefix sizes and at k = 8 (CSR's code at the bytes of a 16-dim
float32 prefix: 8 active units x 8 bytes = 64), at every --precisions (retrieval tasks; CSR: float32 only).

--runs OUT --trained base ...: the runs OUT/METHOD_seedS of experiments/baselines.py or retrieval_methods.py (the
same method and seed trained again), each with a PCA fitted on its own model's encoding of the same fit set: rows
METHOD+pca, and the run's own rows METHOD (kept only where results/baselines/NAME has none, as on a folder of your own;
elsewhere they are compared with the committed ones in meta.json's "reproduction": the largest absolute difference).

--trained-only keeps RESULTS/NAME as written (its untrained references, their fits and what made them, under
"untrained_from" in meta.json) and adds the --trained runs' rows, replacing any of theirs: the untrained references
are not fitted again.

--mrpc-beir DIR writes MRPC's test paraphrases as a BEIR folder at DIR (queries: sentence1 of the pairs labelled
paraphrases; corpus: every sentence2; qrels: the pairs) and scores it by path, as a folder of your own.

Writes RESULTS/NAME/summary.csv with the columns of results/baselines (task, layer, dim, metric, value, method, seed,
setting; method = untrained+KIND, METHOD+pca, or a model's own cells where results/baselines/NAME has none) and meta.json (what made it, what each reference was fitted on, how
long each fit took).
"""
import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import pandas as pd

from matryoshka_lab.core import provenance, resolve_data_dir
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import evaluate, parse_precisions, task_texts
from matryoshka_lab.references import REFERENCES, SharedEncoding, fit_reference, fit_set
from matryoshka_lab.runs import write_atomic
from matryoshka_lab.studies.baselines import EVAL_TASKS, SETTINGS, baseline_config, read_results

CSR_K = 8   # a CSR code of 8 active units: 64 bytes, as a 16-dim float32 prefix
KEY = ["task", "layer", "dim", "metric"]


def write_mrpc_beir(folder: Path, data_dir) -> Path:
    "MRPC test's paraphrase pairs as a BEIR folder: corpus.jsonl (every sentence2), queries.jsonl, qrels/test.tsv."
    rows = pd.read_json(Path(data_dir) / "mrpc" / "test.jsonl", lines=True)
    docs = list(dict.fromkeys(rows.sentence2))
    pos = rows[rows.label == 1]
    queries = list(dict.fromkeys(pos.sentence1))
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"_id": [f"d{i}" for i in range(len(docs))], "title": "", "text": docs}).to_json(
        folder / "corpus.jsonl", orient="records", lines=True)
    pd.DataFrame({"_id": [f"q{i}" for i in range(len(queries))], "text": queries}).to_json(
        folder / "queries.jsonl", orient="records", lines=True)
    q, d = {t: f"q{i}" for i, t in enumerate(queries)}, {t: f"d{i}" for i, t in enumerate(docs)}
    qrels = pd.DataFrame({"query-id": pos.sentence1.map(q), "corpus-id": pos.sentence2.map(d), "score": 1}).drop_duplicates()
    qrels.to_csv(folder / "qrels" / "test.tsv", sep="\t", index=False)
    return folder


def trained_rows(method, seed, runs, setting, tasks, fit, layers, dims, precisions, committed, max_length):
    "A trained run's own rows and its PCA's (METHOD+pca), with how far its own rows are from the committed ones."
    run_dir = Path(runs) / f"{method}_seed{seed}"
    if not (run_dir / "model").is_dir():
        raise SystemExit(f"error: no trained model at {run_dir / 'model'}: train it first (experiments/baselines.py or "
                         "experiments/retrieval_methods.py with --out " + str(runs) + ")")
    cfg = baseline_config(method, seed, run_dir, setting)
    enc = Encoder.from_pretrained(str(run_dir / "model"), pooling=cfg.pooling, max_length=max_length)
    t0 = time.perf_counter()
    pca = fit_reference("pca", SharedEncoding(enc), fit, layers, progress=True)
    fitted = {**pca.describe(), "fit_seconds": round(time.perf_counter() - t0, 1)}
    grid = evaluate(enc, tasks, layers=layers, dims=dims, data_dir=cfg.data_dir, transform=[None, pca], precisions=precisions)
    grid = grid.assign(method=method + grid["transform"].map({"none": "", "pca": "+pca"}), seed=seed,
                       setting=setting).drop(columns="transform")
    old = committed[(committed.method == method) & (committed.seed == seed)] if committed is not None else committed
    own = grid[grid.method == method]
    both = own.merge(old[KEY + ["value"]], on=KEY, suffixes=("", "_committed")) if old is not None else own.iloc[:0]
    check = {"cells": len(both), "max_abs_diff": round(float((both.value - both.value_committed).abs().max()), 4) if len(both) else None}
    new_tasks = set(own.task) - (set(old.task) if old is not None else set())
    return grid[(grid.method != method) | grid.task.isin(new_tasks)], fitted, check


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(SETTINGS), default="angle")
    p.add_argument("--name", default=None, help="the results folder and the baselines' (default: the setting)")
    p.add_argument("--tasks", nargs="+", default=None, help="names or paths (default: the setting's evaluation tasks)")
    p.add_argument("--layers", default=None, help="the hidden states scored (default: the setting's)")
    p.add_argument("--precisions", default="float32")
    p.add_argument("--max-length", type=int, default=None, help="tokens a text (default: the setting's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--runs", default=None, help="the folder of trained runs (METHOD_seedS) for --trained")
    p.add_argument("--trained", nargs="*", default=[], help="methods whose runs in --runs get a PCA of their own")
    p.add_argument("--trained-only", action="store_true", help="keep RESULTS/NAME's untrained rows; add the --trained runs' only")
    p.add_argument("--mrpc-beir", default=None, help="write MRPC's test paraphrases as a BEIR folder here and score it")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--results", default="results/references")
    a = p.parse_args()
    if a.trained and not a.runs:
        p.error("--trained needs --runs, the folder of the trained runs")
    name = a.name or a.setting
    out = Path(a.results) / name
    if a.trained_only and not (a.trained and (out / "summary.csv").is_file() and (out / "meta.json").is_file()):
        p.error(f"--trained-only needs --trained and the results it adds to, {out / 'summary.csv'} and meta.json")
    cfg = baseline_config("mrl", 0, "RUN_DIR", a.setting, data_dir=a.data_dir)
    names = list(a.tasks or EVAL_TASKS[a.setting])
    if a.mrpc_beir:
        names.append(str(write_mrpc_beir(Path(a.mrpc_beir), resolve_data_dir(cfg.data_dir))))
    precisions, layers = parse_precisions(a.precisions), a.layers or cfg.eval_layers
    max_length = a.max_length or cfg.max_length
    enc = Encoder.from_pretrained(cfg.model, max_length=max_length)
    tasks = [load_task(t, cfg.data_dir) for t in names]
    scored = [s for t in tasks for s in task_texts(t)]
    fit = fit_set(REFERENCES, cfg.train_task, cfg.data_dir, exclude=scored, width=enc.hidden_size)
    dims, shared = sorted({CSR_K, *cfg.dims}), SharedEncoding(enc)   # every text encoded once for every reference and seed
    committed = read_results(Path("results/baselines") / name)[0] if (Path("results/baselines") / name).is_dir() else None
    rows, fits, checks, kept = [], {}, {}, {}
    if a.trained_only:
        kept = json.loads((out / "meta.json").read_text())
        was = (kept["eval_tasks"], str(kept["layers"]), kept.get("precisions", ["float32"]))   # (older files: float32)
        if was != ([t.name for t in tasks], str(layers), precisions):
            raise SystemExit(f"error: {out} was scored on {was[0]} at layers {was[1]}, {was[2]}: give --tasks, --layers "
                             "and --precisions as it was written")
        old = pd.read_csv(out / "summary.csv")
        rows.append(old[~old.method.isin([*a.trained, *(m + "+pca" for m in a.trained)])])
        fits = {k: v for k, v in kept["references"].items() if not any(k.startswith(m + "+pca_") for m in a.trained)}
    for seed in a.seeds:
        fitted = []
        for kind in REFERENCES if not a.trained_only else ():
            t0 = time.perf_counter()
            fitted.append(fit_reference(kind, shared, fit, layers, seed=seed, dims=cfg.dims, progress=True))
            fits[f"{kind}_seed{seed}"] = {**fitted[-1].describe(), "fit_seconds": round(time.perf_counter() - t0, 1)}
            print(f"seed {seed}: {kind} fitted in {fits[f'{kind}_seed{seed}']['fit_seconds']} s", file=sys.stderr)
        if fitted:
            own = set(committed.task[committed.method == "untrained"]) if committed is not None else set()
            grid = evaluate(shared, tasks, layers=layers, dims=dims, data_dir=cfg.data_dir, precisions=precisions,
                            transform=[None, *fitted])   # (shared: the evaluation's texts encoded once, for every seed)
            grid = grid[(grid["transform"] != "none") | (~grid.task.isin(own) & (seed == a.seeds[0]))]   # its own: where not committed
            rows.append(grid.assign(method=("untrained+" + grid["transform"]).str.replace("+none", ""), seed=seed,
                                    setting=a.setting).drop(columns="transform"))
        for method in a.trained:
            got, fits[f"{method}+pca_seed{seed}"], checks[f"{method}_seed{seed}"] = trained_rows(
                method, seed, a.runs, a.setting, tasks, fit, layers, dims, precisions, committed, max_length)
            rows.append(got)
            print(f"seed {seed}: {method} and its PCA scored; its own cells against the committed: "
                  f"{checks[f'{method}_seed{seed}']}", file=sys.stderr)
    summary = pd.concat(rows, ignore_index=True).assign(value=lambda d: d.value.round(4))
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "summary.csv", summary.to_csv(index=False))
    meta = {"setting": a.setting, "model": cfg.model, "seeds": a.seeds, "dims": dims, "layers": layers, "max_length": max_length,
            "precisions": precisions, "eval_tasks": [t.name for t in tasks],
            "fit_set": {"source": fit.source, "texts": len(fit.texts), "excluded": fit.excluded, "pairs": len(fit.pairs[0])},
            "references": fits, **({"reproduction": {**kept.get("reproduction", {}), **checks}} if checks else {}),
            **provenance("python experiments/references.py " + shlex.join(sys.argv[1:])),
            **({"untrained_from": kept.get("untrained_from") or {k: kept[k] for k in ("command", "commit", "written")}}
               if a.trained_only else {})}
    write_atomic(out / "meta.json", json.dumps(meta, indent=1, default=str) + "\n")
    top = summary[(summary.layer == summary.layer.max()) & ~summary.task.str.endswith("_dev")
                  & summary.metric.isin(["spearman", "ndcg_at_10"])]
    print(top.groupby(["method", "dim"]).value.mean().unstack().round(2).to_string())
    print(f"wrote {len(summary)} rows to {out / 'summary.csv'}")


if __name__ == "__main__":
    main()
