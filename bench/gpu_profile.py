"""Where a training step and an encode pass spend their time on a GPU: torch.profiler's operator tables.

    python bench/gpu_profile.py [--model embedded] [--data-dir DIR] [--device cuda] [--batch-size 256] [--max-length 128]
                                [--texts N] > results/bench/gpu_profile.txt

The bare model's bf16 step (forward on the 2 x B token rows our SimCSE step passes, mean of the last hidden state,
backward, AdamW: bench/gpu_step.py's bare_bf16), then a base and an MRL trainer (SimCSE, batch 256 x 128 tokens, the
STS-B test sentences; their next batch made in a worker process on CUDA), an MRL trainer making it in a thread
(batch_workers 0), one whose batches were all made (tokenised, pinned) before its first step, and an ESE and a MIPIC
trainer (the two methods over their goals in results/bench/gpu_step.json), each taking 5 warm-up steps, then 10 timed
back to back, then 2 profiled, then 10 read phase by phase (the host's milliseconds in the model's forward, the
backward call, the optimizer's step and, for the trainers, making the batch, the rest of method_views (pooling every
layer), the loss and the clipping; within the loss, ESE's target (ese_projection: its eigendecomposition, which waits
for the device) and MIPIC's SIA and PIC terms are phases of their own; `rest` is the step's host time outside those,
its wait for the device included; medians, each step waited for); then one Encoder.encode pass over the same sentences
is profiled in fp32 and in bf16 (after one unprofiled pass each). Each profile prints its self CPU and self CUDA time
and its 14 costliest operators by self CPU time: a step whose CPU time exceeds its GPU time is bound by the host
issuing kernels, and the step profiles side by side show what the trainer adds to the bare step, MRL to base, and
making the next batch in a process or a thread to MRL. Meant for CUDA; --device cpu with a small batch checks that it
runs.
"""
import argparse
import statistics
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from matryoshka_lab.config import make_config
from matryoshka_lab.data import load_task
from matryoshka_lab.encoder import Encoder
from matryoshka_lab.methods import Callback, TrainData
from matryoshka_lab import losses as losses_module, mipic as mipic_module, trainer as trainer_module
from matryoshka_lab.batches import pin_batch
from matryoshka_lab.trainer import Trainer

from gpu_step import bare_step                     # bench/ is the script's folder: the same bare step


INSIDE = {"model": "views", "target": "loss", "sia": "loss", "pic": "loss"}   # phase -> the phase that calls it


class Phases:
    "Host time of each phase of a step, read by wrapping what the step calls (phase -> seconds, summed within a step)."
    def __init__(self):
        self.now, self._undo = {}, []

    def wrap(self, owner, attr: str, phase: str) -> None:
        before = vars(owner).get(attr, Phases)           # Phases: nothing of owner's own under that name
        inner = getattr(owner, attr)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.now[phase] = self.now.get(phase, 0.0) + time.perf_counter() - t0
        setattr(owner, attr, timed)
        self._undo.append(lambda: delattr(owner, attr) if before is Phases else setattr(owner, attr, before))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def phase_times(step, ks, sync, wraps) -> dict:
    "Median host ms a step in each phase (`wraps`: (owner, attribute, phase)); `host` is the step's call, `wall` until the device is done, `rest` the host time outside the phases (the step's one wait for the device among it)."
    phases, rows = Phases(), []
    for owner, attr, phase in wraps:
        phases.wrap(owner, attr, phase)
    try:
        for k in ks:
            phases.now = {}
            sync()
            t0 = time.perf_counter()
            step(k)
            host = time.perf_counter() - t0
            sync()
            rows.append({**phases.now, "host": host, "wall": time.perf_counter() - t0})
    finally:
        phases.undo()
    out = {name: statistics.median(r.get(name, 0.0) for r in rows) * 1e3 for name in rows[0]}
    for inner, outer in INSIDE.items():                   # a phase's own time: less the phases it holds
        if inner in out and outer in out:
            out[outer] -= out[inner]
    out["rest"] = out["host"] - sum(v for k, v in out.items() if k not in ("host", "wall"))
    return out


def show(prof, title):
    print(f"== {title}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=45))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--texts", type=int, default=None, help="sentences used (default: all; a CPU check needs few)")
    args = p.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    B, L = args.batch_size, args.max_length
    e = Encoder.from_pretrained(args.model, device=device)
    e.model.float()                                   # a folder saved in fp16 (bench/device_payload.py): fp32 weights
    task = load_task("stsb", args.data_dir)
    texts = list(dict.fromkeys(task.test.sentence1 + task.test.sentence2))[:args.texts]
    def timed_and_profiled(step, title, wraps):
        for k in range(5):
            step(k)
        sync()
        t0 = time.perf_counter()
        for k in range(5, 15):
            step(k)
        sync()
        print(f"{title}, 10 back to back: {(time.perf_counter() - t0) * 100:.1f} ms a step")
        ms = phase_times(step, range(17, 27), sync, wraps)
        print(f"{title}, host ms a step by phase (medians of 10 steps, each waited for): "
              + " | ".join(f"{k} {v:.1f}" for k, v in ms.items()))
        with profile(activities=activities) as prof:
            for k in range(15, 17):
                step(k)
            sync()
        show(prof, f"2 {title} steps")

    with tempfile.TemporaryDirectory() as d:
        trainers = {}
        for name, method, workers in (("base", "base", None), ("mrl", "mrl", None), ("mrl thread", "mrl", 0),
                                      ("mrl pretokenised", "mrl", None), ("ese", "ese", None), ("mipic", "mipic", None)):
            cfg = make_config({"model": args.model, "objective": "simcse", "batch_size": B, "max_length": L, "device": str(device),
                               "max_steps": 1000, "eval_every": -1, "diagnostics_every": -1, "run_dir": d,
                               "method": method, "dims": [16, 32, 64, 128, 256, 384], "batch_workers": workers})
            trainers[name] = Trainer(cfg, encoder=e, data=TrainData(texts), progress=False, drop=(Callback,))
        pin = pin_batch if device.type == "cuda" else lambda batch: batch
        made = [pin(trainers["mrl pretokenised"].prepare(k)) for k in range(27)]    # every batch before its steps
        trainers["mrl pretokenised"].batches = made.__getitem__
        e.train()
        rows = [[texts[i] for i in trainers["mrl"].batch_indices(k)] for k in range(27)]
        batches = [{key: torch.cat([v, v]) for key, v in e.tokenize(r, L).items()} for r in rows]
        opt = torch.optim.AdamW(e.model.parameters(), lr=0.0)
        shared = [(e.model, "forward", "model"), (torch.Tensor, "backward", "backward")]
        timed_and_profiled(bare_step(e.model, opt, batches, device, dtype=torch.bfloat16), "bare bf16",
                           shared + [(opt, "step", "optimizer")])
        for method, t in trainers.items():
            def step(k, t=t):
                t.step = k + 1
                t.train_step()
            timed_and_profiled(step, method, shared + [
                (t, "batches", "batch"), (trainer_module, "method_views", "views"), (t, "loss_fn", "loss"),
                (torch.nn.utils, "clip_grad_norm_", "clip"), (t.optimizer, "step", "optimizer"),
                (losses_module, "ese_projection", "target"), (mipic_module, "sia_terms", "sia"),
                (mipic_module, "pic_terms", "pic")])
    e.eval()
    for precision in ("fp32", "bf16"):
        e.encode(texts, precision=precision, progress=False, layers=[-1], batch_size=B)
        with profile(activities=activities) as prof:
            e.encode(texts, precision=precision, progress=False, layers=[-1], batch_size=B)
        show(prof, f"encode {precision}, {len(texts)} texts")


if __name__ == "__main__":
    main()
