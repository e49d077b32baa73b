"""Cost of the Fractal head on cached backbone vectors vs re-encoding the frozen backbone every epoch, side by side.

    python bench/fractal_cache.py [--data-dir DIR] [--model embedded] [--device cpu] [--n 2000] [--epochs 5] [--rounds 3]
                                  [--cache-dir DIR]

The Fractal reproduction (matryoshka_lab.fractal) trains a linear head on a FROZEN backbone, so the backbone's last-layer
pooled vectors are computed once and cached on disk by matryoshka_lab.encoder.encode_cached, keyed by the model's
fingerprint, the texts and the layer/pooling/max length (what fractal_runner.backbone_vectors asks for: layers=[-1], the model's
own pooling and max length). On --n CLINC150 training texts (a seeded random subset) this times:
  hit     encode_cached of the texts when they are already in the cache (hash the texts, np.load the .npy);
  miss    encode_cached into an empty cache folder: encode the texts and write them (the model is already loaded);
  encode  one Encoder.encode of the texts (last layer, no grad): what recomputing the backbone costs per epoch;
  head    fractal_runner.train_head, condition v5 under --protocol (default: the authors'), --epochs epochs, on the
          texts' vectors split 90/10 into train/validation rows as run_fractal does (includes its per-epoch k-NN check).
Every round times each part once, in a rotating order, so the machine's drift hits all alike; figures are medians
over rounds. The two variants are then
  cached     = hit + head                 (vectors read from disk once, E epochs of head training)
  recompute  = E * encode + head          (each epoch re-encodes the texts, then trains one epoch of the head)
The head's work is the same in both, so it is timed once per round and shared. All cache files go to a fresh folder
(inside --cache-dir if given, else the system temp dir) that is deleted at the end: the user's cache is not touched.
The head's batches are tiny (16 x 384): on a busy 2-core machine --threads 1 can make it several times faster.
The backbone runs on --device (default: CUDA when present; the clocks wait for it); the head trains on the CPU, where
fractal_runner.train_head keeps it.
Without a data directory (--data-dir or $MATRYOSHKA_LAB_DATA) the generated builtin_intents corpus stands in (at most
390 short texts): a smoke test, not a measurement of CLINC. The last line is one JSON object.
"""
import argparse
import json
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from matryoshka_lab.core import DATA_ENV, resolve_data_dir, resolve_device
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder, encode_cached
from matryoshka_lab.fractal_runner import PROTOCOLS, encode_levels, fractal_config, stratified_split, train_head

PARTS = ["hit", "miss", "encode", "head"]
# The full comparison: `matryoshka-lab fractal --dataset clinc150 --seeds 5 --conditions v5,mrl --max-train 10000
# --max-test 2000` (5 epochs). fractal_data encodes every CLINC150 train + test text once (15,000 + 4,500), whatever the caps.
FULL = dict(pool=10_000, val_frac=0.1, test=2_000, seeds=5, conditions=2, epochs=5, all_texts=15_000 + 4_500)
REAL_CMD = ("time matryoshka-lab fractal --model embedded --data-dir $MATRYOSHKA_LAB_DATA --dataset clinc150 --seeds 5 "
            "--conditions v5,mrl --max-train 10000 --max-test 2000 --out /tmp/x.json")


def timed(fn, device):
    "(seconds, fn()); on CUDA the clocks are read once the GPU's queued work is done."
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def load_texts(data_dir, n, seed):
    "(texts, labels [2, n] (coarse, fine), n_classes, source) for a seeded random subset of n training texts."
    if resolve_data_dir(data_dir) is None:
        print(f"No data directory (--data-dir or ${DATA_ENV}): using the generated builtin_intents corpus instead of "
              "CLINC150. Its texts are few and short, so these numbers are a smoke test, not a benchmark.")
        name = "builtin_intents"
    else:
        name = "clinc150"
    task = load_task(name, data_dir)
    train_y, test_y, _, classes = encode_levels(task.train, task.test)
    texts, y = list(task.train.text), train_y
    if n > len(texts):                          # the generated corpus is small: add its test texts too
        texts, y = texts + list(task.test.text), torch.cat([train_y, test_y], dim=1)
    if n > len(texts):
        print(f"Only {len(texts)} texts available: --n {n} capped to {len(texts)}.")
        n = len(texts)
    pick = np.sort(np.random.default_rng(seed).choice(len(texts), n, replace=False))
    return [texts[i] for i in pick], y[:, torch.as_tensor(pick)], tuple(len(c) for c in classes), name


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None, help=f"data directory (default: ${DATA_ENV})")
    p.add_argument("--model", default="embedded")
    p.add_argument("--device", default=None, help="the backbone's (default: cuda when available, else cpu)")
    p.add_argument("--n", type=int, default=2000, help="texts (default 2000)")
    p.add_argument("--epochs", type=int, default=5, help="head epochs E (default 5, the paper's)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--protocol", default="authors", choices=list(PROTOCOLS), help="the head's protocol (default: authors)")
    p.add_argument("--seed", type=int, default=42, help="subset, split and head seed")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for everything (default: torch's own, one per core)")
    p.add_argument("--cache-dir", default=None,
                   help="where the temporary cache folder is made (default: the system temp dir); it is deleted at the end")
    args = p.parse_args()
    for name in ("n", "epochs", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    warnings.filterwarnings("ignore")
    if args.threads is not None:
        if args.threads < 1:
            p.error(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)

    texts, y, n_classes, source = load_texts(args.data_dir, args.n, args.seed)
    n = len(texts)
    kept, held = stratified_split(y[1].numpy(), 0.1, args.seed)       # train / validation rows, as run_fractal
    tr, va = torch.as_tensor(kept), torch.as_tensor(held)
    cfg = fractal_config(args.protocol, condition="v5", seed=args.seed, epochs=args.epochs)
    device = resolve_device(args.device)
    load_s, enc = timed(lambda: Encoder.from_pretrained(args.model, device=device).float(), device)   # fp16 folders too
    print(f"{source}: {n} texts ({len(tr)} train + {len(va)} validation rows), {n_classes[0]} coarse / {n_classes[1]} "
          f"fine classes; model {args.model!r} ({enc.pooling} pooling, max_length {enc.max_length}, loaded in "
          f"{load_s:.1f}s); head {cfg.condition}, {cfg.epochs} epochs, batch {cfg.batch_size}; torch threads "
          f"{torch.get_num_threads()}; {args.rounds} rounds", flush=True)

    work = Path(tempfile.mkdtemp(prefix="fractal_cache_bench_", dir=args.cache_dir))
    try:
        # backbone_vectors' call: last layer, the model's own pooling and max length (None -> the encoder's defaults)
        cached = lambda folder: encode_cached(args.model, texts, layers=[-1], cache_dir=folder, encoder=enc,
                                              progress=False)[0]
        t_warm, h = timed(lambda: cached(work / "hit"), device)         # warm-up miss; later calls to this folder hit
        head = lambda: train_head(cfg, h[tr], y[:, tr], h[va], y[:, va], n_classes)
        train_head(fractal_config(args.protocol, condition="v5", seed=args.seed, epochs=1), h[tr][:64], y[:, tr[:64]], h[va], y[:, va],
                   n_classes)                                           # warm-up: first-call overheads of the head
        fresh = enc.encode(texts, layers=[-1], progress=False)[0]
        diff = float((fresh - h).abs().max())                          # recomputed vectors = cached ones
        print(f"  warm-up miss {t_warm:.1f}s; recomputed vs cached vectors: max |diff| {diff:.2e}", flush=True)

        def miss(r):
            folder = work / f"miss{r}"
            t = timed(lambda: cached(folder), device)[0]
            shutil.rmtree(folder)
            return t

        times = {k: [] for k in PARTS}
        for r in range(args.rounds):
            for part in PARTS[r % len(PARTS):] + PARTS[:r % len(PARTS)]:
                if part == "hit":
                    times[part].append(timed(lambda: cached(work / "hit"), device)[0])
                elif part == "miss":
                    times[part].append(miss(r))
                elif part == "encode":
                    times[part].append(timed(lambda: enc.encode(texts, layers=[-1], progress=False), device)[0])
                else:
                    times[part].append(timed(head, device)[0])
            print(f"  round {r + 1}: " + "  ".join(f"{k} {times[k][-1]:.3f}s" for k in PARTS), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    E = args.epochs
    cached_s, recompute_s = med["hit"] + med["head"], E * med["encode"] + med["head"]
    print(f"\nMedians over {args.rounds} rounds, {n} texts, {E} epochs:")
    for k in PARTS:
        print(f"  {k:7s} {med[k]:8.3f}s  (min {min(times[k]):.3f}, max {max(times[k]):.3f})")
    print(f"  cached    = hit + head          {cached_s:8.2f}s")
    print(f"  recompute = {E} x encode + head   {recompute_s:8.2f}s")
    print(f"recompute / cached: {recompute_s / cached_s:.1f}x;  cache miss / hit: {med['miss'] / med['hit']:.0f}x "
          f"(miss - plain encode, i.e. hashing and writing: "
          f"{med['miss'] - med['encode']:+.2f}s)")

    # Extrapolation to the full comparison, linear in the measured per-text costs.
    f = FULL
    enc_pt, hit_pt, miss_pt = med["encode"] / n, med["hit"] / n, med["miss"] / n
    head_pte = med["head"] / (len(tr) * E)                              # per training row and epoch (incl. validation)
    runs, n_tr = f["seeds"] * f["conditions"], round(f["pool"] * (1 - f["val_frac"]))
    n_once = f["pool"] - n_tr + f["test"]                               # validation + test rows, needed once per run
    head_full = runs * head_pte * n_tr * f["epochs"]
    first = load_s + miss_pt * f["all_texts"] + head_full
    later = hit_pt * f["all_texts"] + head_full
    recompute_full = load_s + runs * enc_pt * (f["epochs"] * n_tr + n_once) + head_full
    print(f"\nEXTRAPOLATION (not measured): linear in the per-text costs above, to CLINC150 with {f['pool']:,} training "
          f"texts ({n_tr:,} train + {f['pool'] - n_tr:,} validation), {f['test']:,} test, {f['seeds']} seeds x "
          f"{f['conditions']} conditions x {f['epochs']} epochs:")
    print(f"  cached, first run (miss: all {f['all_texts']:,} CLINC train+test texts encoded once) {first / 60:6.1f} min")
    print(f"  cached, later runs (hit)                                                  {later / 60:6.1f} min")
    print(f"  recompute every epoch ({f['epochs']} x {n_tr:,} train texts per run + val/test once) "
          f"{recompute_full / 60:6.1f} min")
    print(f"  (head training is {head_full / 60:.1f} min of each; excludes the per-run test k-NN evaluation, and the "
          f"validation k-NN grows faster than linearly in the rows)")
    print(f"Measure the real thing (the first run fills your cache; prefix MATRYOSHKA_LAB_CACHE=$(mktemp -d) to time a "
          f"miss again):\n  {REAL_CMD}")

    result = {"recompute_over_cached": round(recompute_s / cached_s, 2),
              "miss_over_hit": round(med["miss"] / med["hit"], 1),
              "cached_seconds": round(cached_s, 3), "recompute_seconds": round(recompute_s, 3),
              "median_seconds": {k: round(v, 4) for k, v in med.items()},
              "model_load_seconds": round(load_s, 2), "source": source, "n_texts": n, "n_train": len(tr),
              "epochs": E, "rounds": args.rounds, "max_abs_diff_recomputed_vs_cached": diff,
              "extrapolated_full_minutes": {"cached_first_run": round(first / 60, 1),
                                            "cached_later_runs": round(later / 60, 1),
                                            "recompute": round(recompute_full / 60, 1)}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
