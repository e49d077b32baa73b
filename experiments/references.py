"""The field's references on a setting's evaluation: the untrained model's PCA, random rotation, Matryoshka-Adaptor
(unsupervised, supervised) and CSR, beside the methods of results/baselines/SETTING.

    python experiments/references.py [--setting angle] [--seeds 0 1 2] [--data-dir DIR] [--results results/references]

Every reference is fitted on the setting's train task (STS-B train for angle) less every text the evaluation scores
(matryoshka_lab.references.fit_set), at the hidden states the baselines are evaluated at (PCA, random: each; the
adaptors and CSR: the last), with each seed of --seeds (PCA has no seed: its rows are the same each time), then
scored on the setting's evaluation tasks at the baselines' prefix sizes and at k = 8 (CSR's code at the bytes of a
16-dim float32 prefix: 8 active units x 8 bytes = 64). Writes RESULTS/SETTING/summary.csv with the columns of
results/baselines (task, layer, dim, metric, value, method, seed, setting; method = untrained+KIND) and meta.json
(what made it, what each reference was fitted on, how long each fit took).
"""
import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import pandas as pd

from matryoshka_lab.core import provenance
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.eval import evaluate, task_texts
from matryoshka_lab.references import REFERENCES, SharedEncoding, fit_reference, fit_set
from matryoshka_lab.runs import write_atomic
from matryoshka_lab.studies.baselines import EVAL_TASKS, SETTINGS, baseline_config

CSR_K = 8   # a CSR code of 8 active units: 64 bytes, as a 16-dim float32 prefix


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(SETTINGS), default="angle")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--data-dir", default=None)
    p.add_argument("--results", default="results/references")
    a = p.parse_args()
    cfg = baseline_config("mrl", 0, "RUN_DIR", a.setting, data_dir=a.data_dir)
    enc = Encoder.from_pretrained(cfg.model, max_length=cfg.max_length)
    tasks = [load_task(t, cfg.data_dir) for t in EVAL_TASKS[a.setting]]
    scored = [s for t in tasks for s in task_texts(t)]
    fit = fit_set(REFERENCES, cfg.train_task, cfg.data_dir, exclude=scored, width=enc.hidden_size)
    dims, shared = sorted({CSR_K, *cfg.dims}), SharedEncoding(enc)   # the fit set encoded once for every reference and seed
    rows, fits = [], {}
    for seed in a.seeds:
        fitted = []
        for kind in REFERENCES:
            t0 = time.perf_counter()
            fitted.append(fit_reference(kind, shared, fit, cfg.eval_layers, seed=seed, dims=cfg.dims, progress=True))
            fits[f"{kind}_seed{seed}"] = {**fitted[-1].describe(), "fit_seconds": round(time.perf_counter() - t0, 1)}
            print(f"seed {seed}: {kind} fitted in {fits[f'{kind}_seed{seed}']['fit_seconds']} s", file=sys.stderr)
        grid = evaluate(enc, tasks, layers=cfg.eval_layers, dims=dims, data_dir=cfg.data_dir, transform=fitted)
        grid = grid[grid["transform"] != "none"]
        rows.append(grid.assign(method="untrained+" + grid["transform"], seed=seed, setting=a.setting).drop(columns="transform"))
    summary = pd.concat(rows, ignore_index=True).assign(value=lambda d: d.value.round(4))
    out = Path(a.results) / a.setting
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "summary.csv", summary.to_csv(index=False))
    meta = {"setting": a.setting, "model": cfg.model, "seeds": a.seeds, "dims": dims, "layers": cfg.eval_layers,
            "eval_tasks": EVAL_TASKS[a.setting], "fit_set": {"source": fit.source, "texts": len(fit.texts),
                                                             "excluded": fit.excluded, "pairs": len(fit.pairs[0])},
            "references": fits, **provenance("python experiments/references.py " + shlex.join(sys.argv[1:]))}
    write_atomic(out / "meta.json", json.dumps(meta, indent=1, default=str) + "\n")
    top = summary[(summary.layer == summary.layer.max()) & summary.task.isin(EVAL_TASKS[a.setting][1:])]
    print(top.groupby(["method", "dim"]).value.mean().unstack().round(2).to_string())
    print(f"wrote {len(summary)} rows to {out / 'summary.csv'}")


if __name__ == "__main__":
    main()
