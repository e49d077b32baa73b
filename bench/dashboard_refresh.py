"""Dashboard refresh: latency from a line being appended to it being seen, and the cost of one tick on a 100k-line log.

    python bench/dashboard_refresh.py [--lines 100000] [--rounds 20]

Measured side by side on the same files, in alternating order:
  append->tail   one record appended and flushed by another process's way of writing (RunLog.log here), then
                 MetricsTail.poll() until it reports the record: the reader's share of the latency (the app polls
                 every PERIOD_MS = 500 ms, so the expected wait adds half a period, 250 ms, on average).
  append->pane   the same, through the app without a browser: Workbench.tick() (the periodic callback) until the
                 step pane reads "step N".
  tick (tail)    one poll of a 100k-line log after one more line was appended (what the monitor does each tick).
  tick (naive)   a full re-read of the same file with parse_metrics (what a dashboard without a tail would do).
  idle tick      one poll when nothing was appended.
Figures are medians over --rounds; the last line is one JSON object.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dashboards"))

from matryoshka_lab.dashboard import MetricsTail  # noqa: E402
from matryoshka_lab.runs import RunLog, parse_metrics  # noqa: E402


def write_log(path: Path, n: int) -> None:
    names = [f"L{l}/d{d}/info_nce" for l in (2, 4, 6) for d in (16, 32, 64, 128)] + ["loss"]
    with open(path, "w") as f:
        for i in range(n):
            step, k = divmod(i, len(names))
            f.write(json.dumps({"step": step, "time": i / 100, "split": "train", "name": names[k], "value": (i % 1000) / 1000}) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    import workbench
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        run = root / "big"
        run.mkdir(parents=True)
        write_log(run / "metrics.jsonl", args.lines)
        size_mb = (run / "metrics.jsonl").stat().st_size / 1e6
        t0 = time.perf_counter()
        tail = MetricsTail(run / "metrics.jsonl")
        tail.poll()
        first_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        wb = workbench.Workbench(root, run="big")
        app_open = time.perf_counter() - t0
        log = RunLog(run)
        step = 10**6
        res = {"append->tail": [], "append->pane": [], "tick (tail)": [], "tick (naive)": [], "idle tick": []}
        for r in range(args.rounds):
            step += 1
            t0 = time.perf_counter()
            log.log(step, "loss", 0.5)
            while tail.poll() == 0:
                pass
            res["append->tail"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            while wb.step.object != f"step {step}":
                wb.tick()
            res["append->pane"].append(time.perf_counter() - t0)
            step += 1
            log.log(step, "loss", 0.5)
            order = [("tick (tail)", tail.poll), ("tick (naive)", lambda: parse_metrics((run / "metrics.jsonl").read_text()))]
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                fn()
                res[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tail.poll()
            res["idle tick"].append(time.perf_counter() - t0)
        log.close()
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"log: {args.lines} lines, {size_mb:.1f} MB; first full read by MetricsTail {first_read * 1e3:.0f} ms; "
          f"opening the run in the app {app_open * 1e3:.0f} ms")
    for k, v in med.items():
        print(f"  {k:<14} {v * 1e3:9.3f} ms  (median of {args.rounds})")
    print(f"  naive full re-read / incremental tick: {med['tick (naive)'] / med['tick (tail)']:.0f}x")
    print(f"  expected append->screen: poll wait {workbench.PERIOD_MS / 2:.0f} ms on average (at most "
          f"{workbench.PERIOD_MS} ms) + {med['append->pane'] * 1e3:.1f} ms + the websocket/browser render")
    print(json.dumps({"lines": args.lines, "first_read_s": round(first_read, 4), "app_open_s": round(app_open, 4),
                      **{k.replace(" ", "_"): round(v, 6) for k, v in med.items()},
                      "naive_over_tail": round(med["tick (naive)"] / med["tick (tail)"], 1)}))


if __name__ == "__main__":
    main()
