"""What RunDirectoryCallback costs a sentence-transformers training run, measured side by side in one run.

    python bench/watch_overhead.py [--model embedded] [--steps 100] [--batch-size 16] [--max-length 32] [--rounds 6]
                                   [--budget 0.05] [--probe-task stsb] [--data-dir DIR] [--out FILE]

Each round trains a fresh copy of --model for --steps steps of SentenceTransformerTrainer with
MatryoshkaLoss(MultipleNegativesRankingLoss) on STS-B train pairs (the generated builtin_sts pairs without a data
directory), twice: without the callback and with RunDirectoryCallback at its defaults (diagnostics of a 256-text probe
of --probe-task within --budget of the training time, no grid tasks: the grid runs only when a user asks for one at the
trainer's evaluations). A round's ratio is its two trainer train_runtimes (every step, its callbacks, the start and
the end) with / without, run back to back; the order alternates between rounds, and the figure is the geometric mean
of the rounds' ratios, over which the two orders balance with an even number of rounds (here the run that goes first
in a round is often the slower by more than the callback costs, and the machine drifts between rounds, so neither a
median of unbalanced rounds nor the medians of each setup's times, also printed, is a fair comparison).
At 100 steps (about a minute here) the callback measures at the start, once in between and at the end, as its budget
allows (fewer steps leave room for the start's alone). The last line is one JSON object: overhead_ratio (the
geometric mean of round_ratios), the goal (<= 1 + budget), the medians, diag_share (the callback's own account:
diagnostics' seconds over training steps' seconds, median over rounds) and diag_measurements (snapshots made in each
round); --out also writes it, with the command, commit and date, to FILE.
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from matryoshka_lab.core import provenance, resolve_data_dir
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import resolve_model
from matryoshka_lab.runs import read_run, write_json
from matryoshka_lab.watch import RunDirectoryCallback


def train_once(model_dir: str, pairs, args, folder: Path, callback) -> float:
    "Seconds of one SentenceTransformerTrainer.train() of args.steps steps (its own train_runtime)."
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MatryoshkaLoss, MultipleNegativesRankingLoss
    torch.manual_seed(0)
    model = SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = args.max_length
    dims = [d for d in (16, 32, 64, 128, 256, 384, 512, 768, 1024) if d < model.get_sentence_embedding_dimension()]
    loss = MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), [model.get_sentence_embedding_dimension(), *dims[::-1]])
    targs = SentenceTransformerTrainingArguments(output_dir=str(folder / "out"), max_steps=args.steps, seed=0,
                                                 per_device_train_batch_size=args.batch_size, logging_steps=1,
                                                 save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=pairs, loss=loss,
                                         callbacks=[callback] if callback else None)
    return float(trainer.train().metrics["train_runtime"])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--budget", type=float, default=0.05)
    p.add_argument("--probe-task", default="stsb")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    for name in ("steps", "batch_size", "max_length", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.budget > 0:
        p.error(f"--budget must be a positive share of the training time, got {args.budget}")
    made = provenance("python bench/watch_overhead.py " + shlex.join(sys.argv[1:]))
    from datasets import Dataset
    data_dir = resolve_data_dir(args.data_dir)
    task = load_task("stsb" if data_dir else "builtin_sts", data_dir)
    split = task.train if getattr(task, "train", None) is not None else task.test
    pairs = Dataset.from_dict({"anchor": list(split.sentence1), "positive": list(split.sentence2)})
    probe_task = args.probe_task if data_dir else "builtin_sts"
    model_dir = resolve_model(args.model)
    print(f"{args.model}: {args.steps} steps x {args.batch_size} pairs x {args.max_length} tokens, "
          f"{args.rounds} rounds, {os.cpu_count()} CPU cores; probe {probe_task}, budget {args.budget:.0%}", flush=True)
    times = {"without": [], "with": []}
    shares, counts = [], []   # the callback's own account: diagnostics' seconds / training steps' seconds; measurements
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ("without", "with") if r % 2 == 0 else ("with", "without")
            for setup in order:
                folder = Path(tmp) / f"{setup}{r}"
                cb = RunDirectoryCallback(folder / "run", probe_task=probe_task, data_dir=data_dir,
                                          diagnostics_budget=args.budget) if setup == "with" else None
                times[setup].append(train_once(model_dir, pairs, args, folder, cb))
                if cb is not None:
                    measured = read_run(folder / "run").arrays.get("diag_erank", [])
                    shares.append(cb.clock.overhead)
                    counts.append(len(measured))
                print(f"round {r + 1} {setup:7s} {times[setup][-1]:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [w / wo for w, wo in zip(times["with"], times["without"])]   # each round's pair ran back to back
    ratio = math.exp(statistics.fmean(math.log(r) for r in ratios))      # the orders balance: what runs first cancels
    result = {"overhead_ratio": round(ratio, 4), "round_ratios": [round(r, 4) for r in ratios],
              "goal": round(1 + args.budget, 4), "goal_met": ratio <= 1 + args.budget,
              "median_s": {k: round(v, 3) for k, v in med.items()},
              "diag_share": round(statistics.median(shares), 4), "diag_measurements": counts}
    if args.out:
        write_json(args.out, {**made, "machine": f"{os.cpu_count()} CPU cores", "settings": vars(args), "times_s": times, **result})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
