"""Dashboard refresh: latency from a line being appended to it being shown, the cost of one refresh tick on a 100k-line
log, and memory over a long open session.

    python bench/dashboard_refresh.py [--lines 100000] [--rounds 20] [--ticks 2000] [--browser] [--soak SECONDS]
                                      [--out results/bench/dashboard_refresh.json]

In-process, side by side on the same files (alternating order where two things are compared):
  append->tail     one record appended and flushed (RunLog.log, as the trainer writes), then MetricsTail.poll() until
                   it reports the record: the reader's share of the latency.
  append->pane     the same through the app without a browser: Workbench.tick() (the periodic callback) until the step
                   pane reads "step N".
  tick (tail)      one poll of the 100k-line log after one more line was appended (what the monitor does each tick).
  tick (naive)     a full re-read of the same file with parse_metrics (what a dashboard without a tail would do).
  tick (redraw)    one Workbench.tick() that also redraws the curves (at most once a second in the app).
  idle tick        one poll when nothing was appended.
  traced memory    Python memory the workbench holds (tracemalloc) after every 500 of --ticks redrawing ticks, each
                   after one more step of 13 metrics: flat when what it keeps is bounded.
--browser: `panel serve dashboards/` on 127.0.0.1 with headless Chromium on the 100k-line run; this process appends a
  step and times until the page's step pane shows it (poll wait of up to PERIOD_MS included: the real figure).
--soak S: with the page open, a writer appends 50 steps a second (13 metrics each) for S seconds; every 10 s it
  prints the server's resident memory, the page's JS heap and how far the page's step pane lags the writer.
Figures are medians over --rounds; the last line is one JSON object; --out also writes it with what made it (the
RESULTS.md's table reads that file).
"""
import argparse
import gc
import json
import os
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from matryoshka_lab import workbench  # noqa: E402
from matryoshka_lab.core import provenance  # noqa: E402
from matryoshka_lab.dashboard import MetricsTail  # noqa: E402
from matryoshka_lab.runs import RunLog, parse_metrics, write_json  # noqa: E402
from test_dashboards import BIG_NAMES, chromium_page, free_port, serve, shown, write_big_log  # noqa: E402


def in_process(run: Path, root: Path, rounds: int) -> dict:
    "The in-process timings (see the module docstring), medians in seconds."
    wb = workbench.Workbench(root, run=run.name)
    tail = MetricsTail(run / "metrics.jsonl")
    tail.poll(float("inf"))                    # the whole log first
    log, step = RunLog(run), 10**6
    res = {k: [] for k in ("append->tail", "append->pane", "tick (tail)", "tick (naive)", "tick (redraw)", "idle tick")}
    for r in range(rounds):
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
        log.log(step, "loss", 0.25)
        wb._plotted = 0.0                      # due for a redraw, as once a second in the app
        t0 = time.perf_counter()
        wb.tick()
        res["tick (redraw)"].append(time.perf_counter() - t0)
    log.close()
    return {k: statistics.median(v) for k, v in res.items()}


def traced_ticks(run: Path, root: Path, ticks: int) -> list[float]:
    "MB traced by tracemalloc after each 500 of `ticks` ticks that each append a step and redraw (the first 500 warm up)."
    wb, log, step, out = workbench.Workbench(root, run=run.name), RunLog(run), 3 * 10**6, []
    for k in range(ticks // 500 + 1):
        for _ in range(500):
            step += 1
            log.log_many(step, {n: 0.5 for n in BIG_NAMES})
            wb._plotted = 0.0
            wb.tick()
        gc.collect()
        if k == 0:
            tracemalloc.start()
        else:
            out.append(tracemalloc.get_traced_memory()[0] / 1e6)
    tracemalloc.stop()
    log.close()
    return out


def rss_mb(pid: int) -> float:
    "Resident memory of a process in MB, from /proc."
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_step(page, step: int, timeout: float = 10.0) -> float:
    "Seconds until the page's step pane shows a step >= `step` (inf past timeout)."
    t0 = time.perf_counter()
    loc = page.locator(f".{workbench.STEP_CLASS}")
    while time.perf_counter() - t0 < timeout:
        text = shown(loc)
        nums = [int(w) for w in text.replace("step", " ").split() if w.isdigit()]
        if nums and max(nums) >= step:
            return time.perf_counter() - t0
        time.sleep(0.005)
    return float("inf")


def js_heap_mb(page) -> float:
    return page.evaluate("performance.memory ? performance.memory.usedJSHeapSize / 1048576 : NaN")


def in_browser(run: Path, root: Path, rounds: int, soak: float) -> dict:
    "append->page latency in headless Chromium, and the soak's memory samples."
    out = {}
    port = free_port()
    with serve(root, port) as (server, _), chromium_page() as page:
        t0 = time.perf_counter()
        page.goto(f"http://127.0.0.1:{port}/dashboards?run={run.name}", timeout=120_000)
        page.locator(f".{workbench.STEP_CLASS}").wait_for(timeout=120_000)
        tail = MetricsTail(run / "metrics.jsonl")
        tail.poll(float("inf"))
        wait_step(page, tail.last_step, timeout=120)
        out["page_open_s"] = time.perf_counter() - t0
        log, step, lat, rng = RunLog(run), tail.last_step, [], random.Random(0)   # above every step logged so far
        for _ in range(rounds):
            step += 1
            t0 = time.perf_counter()
            log.log(step, "loss", 0.5)
            lat.append(time.perf_counter() - t0 if wait_step(page, step) < float("inf") else float("inf"))
            time.sleep(rng.uniform(0, workbench.PERIOD_MS / 1000))   # appends land at random phases of the poll
        out["append->page"] = lat
        if soak > 0:
            out["soak"] = soak_session(page, server.pid, log, step, soak)
        log.close()
    return out


def soak_session(page, pid: int, log: RunLog, step: int, seconds: float) -> list[dict]:
    "A writer appends 50 steps/s of BIG_NAMES for `seconds`; every 10 s a sample of memory and latency."
    state = {"step": step, "stop": False}

    def writer():
        while not state["stop"]:
            state["step"] += 1
            log.log_many(state["step"], {n: (state["step"] % 997) / 997 for n in BIG_NAMES})
            time.sleep(0.02)

    thread = threading.Thread(target=writer, daemon=True)
    samples, t_start = [], time.perf_counter()
    thread.start()
    try:
        while time.perf_counter() - t_start < seconds:
            time.sleep(10)
            target = state["step"]
            lag = wait_step(page, target)
            samples.append({"t_s": round(time.perf_counter() - t_start), "steps_written": target - step,
                            "server_rss_mb": round(rss_mb(pid), 1), "page_js_heap_mb": round(js_heap_mb(page), 1),
                            "append_to_page_s": round(lag, 3)})
            print("  soak", samples[-1], flush=True)
    finally:
        state["stop"] = True
        thread.join()
    return samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ticks", type=int, default=2000, help="redrawing ticks of the traced-memory measurement")
    ap.add_argument("--browser", action="store_true", help="also time append->page in headless Chromium")
    ap.add_argument("--soak", type=float, default=0.0, help="with --browser: seconds of continuous appends")
    ap.add_argument("--out", default=None, help="also write the result with its provenance to this JSON file")
    args = ap.parse_args()
    made = provenance("python bench/dashboard_refresh.py " + shlex.join(sys.argv[1:]))   # the code that runs: its commit now
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        run = root / "big"
        run.mkdir(parents=True)
        write_big_log(run / "metrics.jsonl", args.lines)
        size_mb = (run / "metrics.jsonl").stat().st_size / 1e6
        t0 = time.perf_counter()
        MetricsTail(run / "metrics.jsonl").poll(float("inf"))
        first_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        workbench.Workbench(root, run="big")
        app_open = time.perf_counter() - t0
        med = in_process(run, root, args.rounds)
        traced = traced_ticks(run, root, args.ticks)
        page = in_browser(run, root, args.rounds, args.soak) if args.browser else {}
    print(f"log: {args.lines} lines, {size_mb:.1f} MB; first full read by MetricsTail {first_read * 1e3:.0f} ms; "
          f"opening the run in the app {app_open * 1e3:.0f} ms")
    for k, v in med.items():
        print(f"  {k:<14} {v * 1e3:9.3f} ms  (median of {args.rounds})")
    print(f"  naive full re-read / incremental tick: {med['tick (naive)'] / med['tick (tail)']:.0f}x")
    print("  traced memory after each 500 redrawing ticks: " + ", ".join(f"{m:.2f}" for m in traced) + " MB")
    summary = {"lines": args.lines, "log_mb": round(size_mb, 2), "metrics_per_step": len(BIG_NAMES), "rounds": args.rounds,
               "ticks": args.ticks,
               "first_read_s": round(first_read, 4), "app_open_s": round(app_open, 4),
               **{k.replace(" ", "_"): round(v, 6) for k, v in med.items()},
               "naive_over_tail": round(med["tick (naive)"] / med["tick (tail)"], 1),
               "traced_mb": [round(m, 3) for m in traced]}
    if page:
        lat = sorted(page["append->page"])
        q = {"median": statistics.median(lat), "p90": lat[int(0.9 * (len(lat) - 1))], "max": lat[-1]}
        print(f"  browser: page open on the {args.lines}-line run {page['page_open_s']:.2f} s; append->page "
              + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in q.items())
              + f" over {len(lat)} appends (poll period {workbench.PERIOD_MS} ms)")
        summary.update({"page_open_s": round(page["page_open_s"], 3), "appends": len(lat), "poll_ms": workbench.PERIOD_MS,
                        **{f"append_to_page_{k}_s": round(v, 4) for k, v in q.items()}})
        if page.get("soak"):
            s = page["soak"]
            half = s[len(s) // 2:]
            print(f"  soak: {s[-1]['steps_written']} steps ({s[-1]['steps_written'] * len(BIG_NAMES)} records) in "
                  f"{s[-1]['t_s']} s; server RSS {s[0]['server_rss_mb']} -> {s[-1]['server_rss_mb']} MB "
                  f"(second half {min(x['server_rss_mb'] for x in half)}..{max(x['server_rss_mb'] for x in half)}); "
                  f"page JS heap {s[0]['page_js_heap_mb']} -> {s[-1]['page_js_heap_mb']} MB; "
                  f"latency max {max(x['append_to_page_s'] for x in s):.2f} s")
            summary["soak"] = s
    print(json.dumps(summary))
    if args.out:
        write_json(args.out, {**made, "machine": f"{os.cpu_count()} CPU cores", "result": summary})


if __name__ == "__main__":
    main()
