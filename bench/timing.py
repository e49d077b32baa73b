"""What the benches time with: `from timing import clock` (bench/ is a bench script's folder, so first on its path)."""
import time

import torch


def clock(device: torch.device) -> float:
    "perf_counter once the device's queued work is done (CUDA kernels run asynchronously)."
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
