"""What making the next training batch costs the step that runs beside it, measured side by side in one run.

    python bench/input_pipeline.py [--data-dir DIR] [--model embedded] [--batch-size 256] [--max-length 128]
                                   [--rounds 15] [--rows 1000000] [--out results/bench/input_pipeline.json]

The trainer makes micro-batch k + 1 (Trainer.batches, a BatchesAhead) while step k launches its work: in a background
thread, or in a worker process (batch_workers; the default on CUDA). On a GPU a step is mostly the host launching
kernels, one Python thread: whatever a batch thread does while holding the interpreter lock (GIL) delays it; a worker
process holds no lock of the step's, but takes a core. Batches of --batch-size distinct STS-B and SICK-R test sentences, truncated at
--max-length, interleaved round by round (the machine's speed drifts), medians of --rounds:
  tokenise_ours   Encoder.tokenize(texts, L, device="cpu"): the tokenizer's numpy arrays shared with torch
  tokenise_pt     the tokenizer called with return_tensors="pt" (what Encoder.tokenize did before)
  launch_alone    a loop of small torch ops on one thread (it stands for a step's kernel launches: each op is
                  dispatch, not arithmetic)
  launch_beside_ours, launch_beside_pt
                  the same loop while the other thread tokenises one batch the named way (started just before)
  launch_beside_worker
                  the same loop right after a BatchesAhead(workers=1) handed over batch k and asked its forked
                  process for batch k + 1 (the next batch of the list, tokenised ours way on one thread), waited for
                  after the loop
  permutation     torch.randperm(--rows) from a seeded generator: what each micro-batch drew before
                  Trainer.batch_indices kept its epoch's permutation
Printed: each median, tokenise_pt_over_ours (> 1: ours faster), and each way's cost to the loop beside it
(launch_beside_X minus launch_alone, ms). Both tokenisers give the same tensors (checked on every batch). The last line
is one JSON object; --out also writes it with what made it.
"""
import argparse
import json
import shlex
import statistics
import sys
import threading
import time

import torch

from matryoshka_lab.core import provenance
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.runs import write_json
from matryoshka_lab.batches import BatchesAhead

LOOP_OPS = 2000   # iterations of three tiny ops: about the host time of a step on this machine


def launch_loop(x):
    "Dispatch-bound work on the calling thread: LOOP_OPS x three ops on a 4-element tensor."
    for _ in range(LOOP_OPS):
        y = (x + 1) * 2
        y.sum()


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None, help="default: $MATRYOSHKA_LAB_DATA")
    p.add_argument("--model", default="embedded")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--rows", type=int, default=1_000_000, help="training rows for the permutation's cost")
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    if args.batch_size < 1 or args.rounds < 1 or args.rows < 1:
        p.error("--batch-size, --rounds and --rows must be at least 1")
    made = provenance("python bench/input_pipeline.py " + shlex.join(sys.argv[1:]))
    torch.set_num_threads(1)                      # the launch loop is one thread, as a step's host side is
    enc = Encoder.from_pretrained(args.model, device="cpu")
    tasks = [load_task(t, args.data_dir) for t in ("stsb", "sickr")]
    texts = list(dict.fromkeys(s for t in tasks for s in t.test.sentence1 + t.test.sentence2))
    n_batches = len(texts) // args.batch_size
    if n_batches < 1:
        p.error(f"only {len(texts)} sentences for --batch-size {args.batch_size}")
    batches = [texts[k * args.batch_size:(k + 1) * args.batch_size] for k in range(n_batches)]
    L = args.max_length

    def ours(b):
        return enc.tokenize(b, L, device="cpu")

    def pt(b):
        out = enc.tokenizer(b, padding=True, truncation=True, max_length=L, return_tensors="pt")
        return {k: v for k, v in out.items() if k in enc._accepted}

    x = torch.zeros(4)

    def beside(tokenise, batch):
        "The launch loop's time while a second thread tokenises `batch`."
        worker = threading.Thread(target=tokenise, args=(batch,))
        worker.start()
        t = timed(lambda: launch_loop(x))
        worker.join()
        return t

    worker = BatchesAhead(lambda k: (None, *[ours(batches[k % n_batches])] * 2), workers=1)
    asked = iter(range(10 ** 9))

    def beside_worker(batch):
        "The launch loop's time while the worker process makes the next batch."
        k = next(asked)
        worker(k)                                 # hands over batch k, asks for k + 1
        t = timed(lambda: launch_loop(x))
        worker.ahead[k + 1].result()
        return t

    setups = {"tokenise_ours": lambda b: timed(lambda: ours(b)), "tokenise_pt": lambda b: timed(lambda: pt(b)),
              "launch_alone": lambda b: timed(lambda: launch_loop(x)),
              "launch_beside_ours": lambda b: beside(ours, b), "launch_beside_pt": lambda b: beside(pt, b),
              "launch_beside_worker": beside_worker,
              "permutation": lambda b: timed(lambda: torch.randperm(args.rows,
                                                                    generator=torch.Generator().manual_seed(0)))}
    for b in batches[:2]:                         # warm-up, and the same tensors both ways
        a, c = ours(b), pt(b)
        if a.keys() != c.keys() or not all(torch.equal(a[k], c[k]) for k in a):
            sys.exit("Encoder.tokenize and return_tensors='pt' differ")
        launch_loop(x)
        beside_worker(b)                          # the first forks the worker
    names = list(setups)
    times = {n: [] for n in names}
    for r in range(args.rounds):
        batch = batches[r % n_batches]
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(setups[name](batch))
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    print(f"{'setup':20s} {'ms':>8s} {'min':>8s} {'max':>8s}")
    for n in names:
        print(f"{n:20s} {med[n]:8.2f} {min(times[n]) * 1e3:8.2f} {max(times[n]) * 1e3:8.2f}")
    result = {"tokenise_pt_over_ours": round(med["tokenise_pt"] / med["tokenise_ours"], 3),
              "loop_cost_of_ours_ms": round(med["launch_beside_ours"] - med["launch_alone"], 2),
              "loop_cost_of_pt_ms": round(med["launch_beside_pt"] - med["launch_alone"], 2),
              "loop_cost_of_worker_ms": round(med["launch_beside_worker"] - med["launch_alone"], 2),
              "median_ms": {n: round(v, 2) for n, v in med.items()},
              "batch_size": args.batch_size, "max_length": L, "rounds": args.rounds, "rows": args.rows,
              "loop_ops": LOOP_OPS, "torch": torch.__version__}
    worker.close()
    for k in ("tokenise_pt_over_ours", "loop_cost_of_ours_ms", "loop_cost_of_pt_ms", "loop_cost_of_worker_ms"):
        print(f"{k:22s} {result[k]}")
    print(json.dumps(result))
    if args.out:
        write_json(args.out, {**made, "result": result})


if __name__ == "__main__":
    main()
