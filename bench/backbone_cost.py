"""What a study costs on the second backbone (all-mpnet-base-v2, `requirements/mpnet.txt`) against the embedded all-MiniLM-L6-v2,
measured side by side in one run.

    python bench/backbone_cost.py [--data-dir DIR] [--methods mrl 2dmse mic] [--steps 5] [--rounds 2] [--texts 256]
                                  [--out results/bench/backbone_cost.json]

For each model, the seconds of one training step of the AnglE setting of experiments/baselines.py (`angle` and
`angle_mpnet` of studies.baselines: STS-B train pairs, batch 32 x 48 tokens) per method, as the median interval between
logged steps after the first, and the rate of encoding STS-B test sentences at every hidden state (what the evaluator
does). The models alternate within each round so that the machine's drift hits both alike; figures are medians over
rounds. From the measured rates it also estimates one run of each setting (--sweep-steps steps plus the evaluation of its
tasks' sentences): an estimate, not a measurement. Run it alone on the machine; it needs a data directory (STS-B).
The last line is one JSON object; --out also writes it with what made it (the command, library version, commit).
"""
import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from matryoshka_lab.core import DATA_ENV, provenance, resolve_data_dir
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.runs import read_run, write_json
from matryoshka_lab.studies.baselines import EVAL_TASKS, baseline_config
from matryoshka_lab.trainer import Trainer

SETTINGS = {"embedded": "angle", "mpnet": "angle_mpnet"}


def step_seconds(method: str, setting: str, steps: int, data_dir) -> float:
    "Median seconds between consecutive training steps after the first, of a fresh `steps`-step run of `method` in `setting`."
    with tempfile.TemporaryDirectory() as tmp:
        cfg = baseline_config(method, 0, Path(tmp) / "run", setting, max_steps=steps, eval_every=-1, data_dir=str(data_dir))
        Trainer(cfg, progress=False).fit()
        m = read_run(Path(tmp) / "run").metrics
        times = m[m.name == "loss"].sort_values("step").time.to_numpy()
    return float(np.median(np.diff(times)))


def encode_rate(encoder: Encoder, texts: list) -> float:
    "Texts per second of encoding `texts` at every hidden state."
    t = time.perf_counter()
    encoder.encode(texts, layers="all", progress=False)
    return len(texts) / (time.perf_counter() - t)


def eval_sentences(setting: str, data_dir) -> int:
    "Distinct sentences the setting's evaluation tasks encode."
    seen = set()
    for task in EVAL_TASKS[setting]:
        test = load_task(task, data_dir).test
        seen.update(test.sentence1)
        seen.update(test.sentence2)
    return len(seen)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None, help=f"data directory (default: ${DATA_ENV})")
    p.add_argument("--methods", nargs="+", default=["mrl", "2dmse", "mic"])
    p.add_argument("--steps", type=int, default=5, help="training steps a measurement (the first is not timed)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--texts", type=int, default=256, help="STS-B test sentences to encode")
    p.add_argument("--sweep-steps", type=int, default=200, help="steps of the estimated run (experiments/baselines.py: 200)")
    p.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = p.parse_args()
    for name in ("steps", "rounds", "texts", "sweep_steps"):
        if getattr(args, name) < (3 if name == "steps" else 1):
            p.error(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    data_dir = resolve_data_dir(args.data_dir)
    if data_dir is None:
        p.error(f"a data directory is needed (--data-dir or ${DATA_ENV}): the AnglE setting trains on STS-B")
    made = provenance("python bench/backbone_cost.py " + shlex.join(sys.argv[1:]))   # the code that runs: its commit now
    texts = list(load_task("stsb", data_dir).test.sentence1[:args.texts])
    encoders = {model: Encoder.from_pretrained(model) for model in SETTINGS}
    steps = {model: {m: [] for m in args.methods} for model in SETTINGS}
    rates = {model: [] for model in SETTINGS}
    print(f"{len(SETTINGS)} models x {args.methods}, {args.steps} steps each, {args.texts} texts; torch threads "
          f"{torch.get_num_threads()}; {args.rounds} rounds", flush=True)
    for r in range(args.rounds):
        for model in (list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]):
            for method in args.methods:
                steps[model][method].append(step_seconds(method, SETTINGS[model], args.steps, data_dir))
            rates[model].append(encode_rate(encoders[model], texts))
            print(f"round {r + 1}, {model}: " + ", ".join(f"{m} {v[-1]:.2f} s/step" for m, v in steps[model].items())
                  + f", encode {rates[model][-1]:.0f} texts/s", flush=True)
    med = lambda xs: statistics.median(xs)
    result = {"models": {}, "ratios_mpnet_over_embedded": {}}
    for model, setting in SETTINGS.items():
        step_s = {m: med(v) for m, v in steps[model].items()}
        n_eval = eval_sentences(setting, data_dir)
        result["models"][model] = {
            "setting": setting, "step_s": step_s, "encode_texts_per_s": med(rates[model]), "eval_sentences": n_eval,
            "estimated_run_min": {m: (args.sweep_steps * s + n_eval / med(rates[model])) / 60 for m, s in step_s.items()}}
    for m in args.methods:
        result["ratios_mpnet_over_embedded"][f"step_{m}"] = med(steps["mpnet"][m]) / med(steps["embedded"][m])
    result["ratios_mpnet_over_embedded"]["encode_time"] = med(rates["embedded"]) / med(rates["mpnet"])
    settings = {"methods": args.methods, "steps": args.steps, "rounds": args.rounds, "texts": args.texts,
                "sweep_steps": args.sweep_steps, "threads": torch.get_num_threads()}
    shared = baseline_config(args.methods[0], 0, "unused", "angle")
    settings.update(batch_size=shared.batch_size, max_length=shared.max_length)
    record = {"settings": settings, "result": result, "times": {"step_s": steps, "encode_texts_per_s": rates}}
    if args.out:
        write_json(args.out, {**made, **record})
    print(json.dumps(record))


if __name__ == "__main__":
    main()
