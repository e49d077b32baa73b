"""What the benches time with and how they record it: `from timing import clock, write_record` (bench/ is a bench
script's folder, so first on its path)."""
import os
import shlex
import sys
import time
from datetime import date
from pathlib import Path

import torch

from matryoshka_lab.core import git_commit
from matryoshka_lab.runs import write_json


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
