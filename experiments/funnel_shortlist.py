"""How large a funnel's shortlist must be, corpus by corpus: the evidence behind deploy.DEFAULT_SHORTLIST.

    python experiments/funnel_shortlist.py [--data-dir DIR] [--model embedded] [--out results/deploy/funnel_shortlist.json]

For each corpus, the model's last layer (mean pooled, the model's own maximum length: 256 tokens for the embedded
model) embeds queries and documents once (cached on disk: encoder.encode_cached); a flat deploy.FunnelIndex per
shortlister (binary 128/256/384, float32 32/64/128) then searches every query at every shortlist size of
deploy.SHORTLISTS, and each setting is scored two ways: nDCG@10 over exact full-width search's (FAISS IndexFlatIP; eval.retrieval_metrics,
the relevance labels), and the label-free agreement with exact search (FunnelIndex.agreement: nn_recall, the share of
queries whose exact nearest document the funnel's top 10 holds; overlap, the share of exact search's top 10 it
holds). For binary 256, FunnelIndex.calibrate(target=0.995) on 200 sampled queries picks a shortlist, scored on all
queries. No timing: bench/funnel.py measures latency.

Corpora: `tune` (the default is the smallest size >= 0.99 of exact nDCG@10 for binary 256 on every one of them) and
`check` (held out: the default is then scored there). `20newsgroups_threads` is the first day's corpus of issue 58,
rebuilt from the 20 Newsgroups test split: 200 thread subjects ("Re:" stripped) with at least two posts as queries,
their posts relevant, other posts to 3,000 documents (seed 0). Writes one JSON file with what made it.
"""
import argparse
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from matryoshka_lab.core import provenance, resolve_data_dir
from matryoshka_lab.data import RetrievalData, load_task
from matryoshka_lab.deploy import DEFAULT_SHORTLIST, SHORTLISTS, FunnelIndex
from matryoshka_lab.encoder import encode_cached
from matryoshka_lab.eval import retrieval_metrics
from matryoshka_lab.routing import build_index, unit_prefix
from matryoshka_lab.runs import write_json

ROOT = Path(__file__).resolve().parents[1]
TUNE = ("mrpc_paraphrase_59k", "arxiv_title_abstract", "clinc150_intents", "20newsgroups_threads")
CHECK = ("banking77_intents", "stsb_paraphrase", "mrpc_paraphrase")
SHORTLISTERS = (("binary", 128), ("binary", 256), ("binary", 384), ("float32", 32), ("float32", 64), ("float32", 128))
RATIO = 0.99
CALIBRATION_QUERIES, CALIBRATION_TARGET = 200, 0.995


def newsgroup_threads(data_dir: Path, n_queries: int = 200, n_docs: int = 3000, seed: int = 0) -> RetrievalData:
    "Thread subjects as queries, the thread's posts relevant, among other posts of the 20 Newsgroups test split."
    df = pd.read_json(data_dir / "20newsgroups" / "test.jsonl", lines=True)
    df = df[df.text.str.strip() != ""].reset_index(drop=True)
    df["thread"] = [re.sub(r"^(\s*re\s*:\s*)+", "", str(s), flags=re.I).strip() for s in df.subject]
    key = df.thread.str.lower()
    sizes = key.value_counts()
    rng = np.random.default_rng(seed)
    threads = rng.choice(sorted(sizes[(sizes >= 2) & (sizes.index != "")].index), n_queries, replace=False)
    posts = np.flatnonzero(key.isin(threads))
    others = rng.choice(np.setdiff1d(np.arange(len(df)), posts), n_docs - len(posts), replace=False)
    docs = df.iloc[np.sort(np.concatenate([posts, others]))]
    row = {k: i for i, k in enumerate(docs.index)}
    queries = [df.thread[key == t].iloc[0] for t in threads]
    qrels = tuple({row[j]: 1 for j in np.flatnonzero(key == t)} for t in threads)
    return RetrievalData(queries, docs.text.tolist(), qrels, doc_ids=tuple(docs.id))


def corpus_rows(name: str, task: RetrievalData, model: str) -> tuple[dict, list[dict]]:
    emb = encode_cached(model, list(task.queries) + list(task.corpus), layers="-1")[0].numpy()
    q, c = emb[:len(task.queries)], emb[len(task.queries):]
    full = c.shape[1]
    exact = retrieval_metrics(build_index(unit_prefix(c, full)).search(unit_prefix(q, full), 10)[1], task.qrels)
    rows = []
    for precision, prefix in SHORTLISTERS:
        index = FunnelIndex(c, prefix, precision)
        agree = index.agreement(q, 10, SHORTLISTS).set_index("shortlist")
        for s in (s for s in SHORTLISTS if s <= len(c)):
            m = retrieval_metrics(index.search(q, 10, shortlist=s), task.qrels)
            rows.append({"corpus": name, "precision": precision, "prefix": prefix, "shortlist": s,
                         "ndcg_ratio": round(m["ndcg_at_10"] / exact["ndcg_at_10"], 4),
                         "nn_recall": round(float(agree.nn_recall[s]), 4), "overlap": round(float(agree.overlap[s]), 4)})
        if (precision, prefix) == ("binary", 256):             # calibrate on a sample, scored on every query
            sample = q[np.random.default_rng(0).choice(len(q), min(CALIBRATION_QUERIES, len(q)), replace=False)]
            index.calibrate(sample, CALIBRATION_TARGET)
            m = retrieval_metrics(index.search(q, 10), task.qrels)
            calibrated = {"shortlist": index.default_shortlist, "ndcg_ratio": round(m["ndcg_at_10"] / exact["ndcg_at_10"], 4)}
    info = {"corpus": name, "n_queries": len(q), "n_corpus": len(c), "exact_ndcg_at_10": round(exact["ndcg_at_10"], 2),
            "calibrated": calibrated}
    print(f"{name}: {len(q)} queries, {len(c)} documents, exact nDCG@10 {info['exact_ndcg_at_10']}", flush=True)
    return info, rows


def smallest(rows: pd.DataFrame, corpora, column: str = "ndcg_ratio", floor: float = RATIO) -> int | None:
    "The smallest shortlist at which binary 256 keeps `floor` of `column` on every corpus (None: none does)."
    b = rows[(rows.precision == "binary") & (rows.prefix == 256) & rows.corpus.isin(corpora)]
    ok = b.groupby("shortlist").apply(lambda g: len(g) == len(corpora) and (g[column] >= floor).all())
    return int(ok[ok].index.min()) if ok.any() else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="embedded")
    p.add_argument("--out", default=str(ROOT / "results" / "deploy" / "funnel_shortlist.json"))
    args = p.parse_args()
    made = provenance("python experiments/funnel_shortlist.py " + shlex.join(sys.argv[1:]))
    data_dir = resolve_data_dir(args.data_dir)
    if data_dir is None:
        p.error("the shared data is needed: --data-dir DIR or $MATRYOSHKA_LAB_DATA")
    infos, rows = [], []
    for name in TUNE + CHECK:
        task = newsgroup_threads(data_dir) if name == "20newsgroups_threads" else load_task(name, data_dir).test
        info, r = corpus_rows(name, task, args.model)
        infos.append({**info, "role": "tune" if name in TUNE else "check"})
        rows += r
    df = pd.DataFrame(rows)
    chosen = smallest(df, TUNE)
    at = df[(df.precision == "binary") & (df.prefix == 256) & (df.shortlist == DEFAULT_SHORTLIST)]
    lowest = min(infos, key=lambda i: i["calibrated"]["ndcg_ratio"])
    summary = {"rule": f"smallest shortlist with binary 256 at >= {RATIO} of exact nDCG@10 on every tune corpus",
               "chosen": chosen, "library_default": DEFAULT_SHORTLIST,
               "at_default": at.set_index("corpus")[["ndcg_ratio", "nn_recall", "overlap"]].to_dict("index"),
               "calibrated_lowest_ratio": {"corpus": lowest["corpus"], **lowest["calibrated"]},
               "smallest_on_check": smallest(df, CHECK)}
    print(df[(df.precision == "binary") & (df.prefix == 256)].pivot(index="shortlist", columns="corpus",
                                                                     values="ndcg_ratio").to_string())
    print({i["corpus"]: i["calibrated"] for i in infos})
    print(summary)
    write_json(args.out, {**made, "model": args.model, "corpora": infos, "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
