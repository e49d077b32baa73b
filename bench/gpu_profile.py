"""Where a training step and an encode pass spend their time on a GPU: torch.profiler's operator tables.

    python bench/gpu_profile.py [--model embedded] [--data-dir DIR] > results/bench/gpu_profile.txt

An MRL trainer (SimCSE, batch 256 x 128 tokens, the STS-B test sentences) takes 5 warm-up steps, then 10 timed back to
back, then 2 profiled; then one Encoder.encode pass over the same sentences is profiled in fp32 and in bf16 (after one
unprofiled pass each). Each profile prints its self CPU and self CUDA time and its 14 costliest operators by self CPU
time: a step whose CPU time exceeds its GPU time is bound by the host issuing kernels. Runs on CUDA only.
"""
import argparse
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from matryoshka_lab.config import make_config
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.methods import Callback, TrainData
from matryoshka_lab.trainer import Trainer


def show(prof, title):
    print(f"== {title}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=45))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()
    e = Encoder.from_pretrained(args.model, device="cuda")
    e.model.float()                                   # a folder saved in fp16 (bench/device_payload.py): fp32 weights
    task = load_task("stsb", args.data_dir)
    texts = list(dict.fromkeys(task.test.sentence1 + task.test.sentence2))
    with tempfile.TemporaryDirectory() as d:
        cfg = make_config({"model": args.model, "objective": "simcse", "batch_size": 256, "max_length": 128,
                           "max_steps": 1000, "eval_every": -1, "diagnostics_every": -1, "run_dir": d,
                           "dims": [16, 32, 64, 128, 256, 384]})
        t = Trainer(cfg, encoder=e, data=TrainData(texts), progress=False, drop=(Callback,))
        e.train()
        for s in range(1, 6):
            t.step = s
            t.train_step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in range(6, 16):
            t.step = s
            t.train_step()
        torch.cuda.synchronize()
        print(f"mrl step, 10 back to back: {(time.perf_counter() - t0) * 100:.1f} ms")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for s in range(16, 18):
                t.step = s
                t.train_step()
            torch.cuda.synchronize()
        show(prof, "2 mrl steps")
    e.eval()
    for precision in ("fp32", "bf16"):
        e.encode(texts, precision=precision, progress=False, layers=[-1], batch_size=256)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            e.encode(texts, precision=precision, progress=False, layers=[-1], batch_size=256)
        show(prof, f"encode {precision}, {len(texts)} texts")


if __name__ == "__main__":
    main()
