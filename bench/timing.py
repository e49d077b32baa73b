"""What the benches time with and how they record it: `from timing import clock, write_record`, and the training steps
they time (bench/ is a bench script's folder, so first on its path)."""
import os
import shlex
import sys
import time
from datetime import date
from pathlib import Path

import torch

from matryoshka_lab.core import git_commit
from matryoshka_lab.methods import get_method
from matryoshka_lab.runs import write_json
from matryoshka_lab.views import method_views


def clock(device: torch.device) -> float:
    "perf_counter once the device's queued work is done (CUDA kernels run asynchronously)."
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def write_record(path, device: torch.device, result: dict) -> None:
    "A bench's result written to path with the command that ran it, the commit, the date and the machine."
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} CPU cores"
    write_json(path, {"command": f"python bench/{Path(sys.argv[0]).name} " + shlex.join(sys.argv[1:]),
                      "commit": git_commit(), "date": date.today().isoformat(), "machine": machine, "result": result})


def method_step(enc, method: str, loss, batch_a, batch_b, opt, gen):
    "One step of `loss` on the one-pass views the trainer gives `method` (token states for MIPIC and MIC): backward, optimizer."
    method = get_method(method)
    def step():
        opt.zero_grad(set_to_none=True)
        a, b = method_views(method, enc, batch_a, batch_b)
        loss(a, b, None, generator=gen).total.backward()
        opt.step()
    return step


def st_step(loss, feats, opt):
    "One step of a sentence-transformers loss on tokenised features: backward, optimizer."
    def step():
        opt.zero_grad(set_to_none=True)
        loss(feats, None).backward()
        opt.step()
    return step
