"""What a person waits for in the workbench, served and inline, in headless Chromium: the first page, a snapshot switch,
a new step on the page (inline also while another cell keeps the kernel busy).

    python bench/page_latency.py [--rounds 7] [--sessions 3] [--out results/bench/page_latency.json]

One runs root with one run the size of a CPU training run (300 steps of 13 training records, a 7 x 6 evaluation
grid and three diagnostics snapshots every 50 steps, the variance spectrum [7, 384]); each measured alone, in turn:
  served first page  `panel serve dashboards/` started, then a page opened at ?run=live until its step pane shows
                     the run's last step (the first session of a fresh server, then --rounds more in new pages);
  inline first page  in JupyterLab with the kernel started and the workbench imported (a notebook's import cell,
                     timed on its own: "kernel import"), the cell `show(root, "live")` run until the step shows;
                     "first page, cold kernel" is the two cells together; each in a fresh JupyterLab, kernel and
                     page, --sessions of them;
  snapshot switch    the Snapshots tab's step slider moved one step (the keyboard on its handle) until the figure's
                     title names the new step;
  new step           another process appends a step (RunLog, as the trainer writes) until the step pane shows it;
                     inline also while a second cell runs pure Python for 60 s.
Goals (issue 67): first page <= 3 s, a switch <= 1 s, a new step <= 1 s, each a median. Printed beside each median:
its ratio to the goal (<= 1 meets it). The last line is one JSON object; --out also writes it with what made it.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from matryoshka_lab.core import provenance  # noqa: E402
from matryoshka_lab.runs import RunLog, write_json  # noqa: E402
from test_dashboards import (BUSY, WRITER, chromium_page, free_port, jupyter_lab, notebook_with, run_first_cell,  # noqa: E402
                             serve, shown)

GOALS = {"first page": 3.0, "snapshot switch": 1.0, "new step": 1.0}
STEPS = 300


def write_training_run(run: Path) -> None:
    "A CPU training run's records: 13 training metrics a step, a 7 x 6 grid and three snapshots every 50 steps."
    log, rng = RunLog(run, config={"dims": [16, 32, 64, 128, 256, 384], "method": "mrl"}), np.random.default_rng(0)
    parts = ["loss", "lr", "grad_norm"] + [f"L6/d{d}/infonce" for d in (16, 32, 64, 128, 256, 384)] + ["mrl", "a", "b", "c"]
    for s in range(1, STEPS + 1):
        log.log_many(s, {p: float(rng.random()) for p in parts})
        if s % 50 == 0:
            log.log_many(s, {f"stsb/L{l}/d{d}/spearman": 50 + 4 * l + d / 32 for l in range(7)
                             for d in (16, 32, 64, 128, 256, 384)}, split="eval")
            log.save_array("diag_variance", s, rng.random((7, 384)))
            log.save_array("diag_xcorr", s, rng.uniform(-1, 1, (16, 368)))
            log.save_array("diag_cka_layers", s, rng.random((7, 7)))
    log.close()


def until(check, timeout: float = 60.0) -> float:
    "Seconds until check() is true (inf past timeout)."
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if check():
            return time.perf_counter() - t0
        time.sleep(0.01)
    return float("inf")


def shows_step(page, n: int):
    return lambda: f"step {n}" in shown(page.locator(".ml-step").last)


def new_step(page, run: Path, n: int) -> float:
    "Another process writes step n; seconds from its write until the page's step pane shows it."
    res = subprocess.run([sys.executable, "-c", WRITER, str(run), str(n)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    written = float(res.stdout.split()[-1])
    until(shows_step(page, n), 30)
    return time.time() - written


def snapshot_switches(page, rounds: int) -> list[float]:
    "Open the Snapshots tab; move its step slider one snapshot at a time (back, then forth at the ends): seconds until the figure names the step."
    page.get_by_text("Snapshots", exact=True).last.click()
    handle = page.locator(".noUi-handle >> visible=true").first
    handle.wait_for(timeout=30_000)
    titled = lambda step: lambda: page.locator(".role-title-text").filter(has_text=f"(step {step})").count() > 0
    steps, i, direction, out = list(range(50, STEPS + 1, 50)), STEPS // 50 - 1, -1, []
    until(titled(steps[i]), 30)
    for _ in range(rounds):
        if not 0 <= i + direction < len(steps):
            direction = -direction
        i += direction
        handle.focus()
        t0 = time.perf_counter()
        page.keyboard.press("ArrowLeft" if direction < 0 else "ArrowRight")
        until(titled(steps[i]), 30)
        out.append(time.perf_counter() - t0)                     # from the key press, not from after it
    page.get_by_text("Monitor", exact=True).last.click()
    return out


def served(root: Path, rounds: int) -> dict:
    port, out = free_port(), {"first page": [], "new step": []}
    with serve(root, port):
        with chromium_page(1500, 1100) as page:
            t0 = time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}/dashboards?run=live", timeout=120_000)
            until(shows_step(page, STEPS), 120)
            out["first page, new server"] = time.perf_counter() - t0
            out["snapshot switch"] = snapshot_switches(page, rounds)
            out["new step"] = [new_step(page, root / "live", STEPS + 1 + i) for i in range(rounds)]
        last = STEPS + rounds
        for _ in range(rounds):
            with chromium_page(1500, 1100) as page:
                t0 = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/dashboards?run=live", timeout=120_000)
                until(shows_step(page, last), 120)
                out["first page"].append(time.perf_counter() - t0)
    return out


def inline(folder: Path, root: Path, rounds: int, step0: int, sessions: int) -> dict:
    "Each session a fresh JupyterLab, kernel and page (a first page is one a session): the import cell, then show(); the last session also times snapshot switches and new steps, the kernel idle and busy."
    out = {"first page": [], "first page, cold kernel": [], "kernel import": []}
    for session in range(sessions):
        where = folder / f"lab{session}"
        where.mkdir()
        path = notebook_with(where, "inline.ipynb", "1 + 1")
        nb = json.loads(path.read_text())
        first = nb["cells"][0]
        nb["cells"] = [first, {**first, "id": "c1", "source": "from matryoshka_lab.workbench import show"},
                       {**first, "id": "c2", "source": f"show({str(root)!r}, 'live')"},
                       {**first, "id": "c3", "source": BUSY.format(seconds=60)}]
        path.write_text(json.dumps(nb))
        port = free_port()
        with jupyter_lab(where, port), chromium_page(1500, 1600) as page:
            run_first_cell(page, f"http://127.0.0.1:{port}/lab/tree/inline.ipynb?token=t", shows=".jp-OutputArea-output")
            cells = page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor >> visible=true")
            cells.nth(1).click()
            page.keyboard.press("Shift+Enter")                   # the import cell: done when its prompt says [2]
            imported = until(lambda: page.locator(".jp-InputPrompt >> text=[2]").count() > 0, 120)
            cells.nth(2).click()
            t0 = time.perf_counter()
            page.keyboard.press("Shift+Enter")
            until(shows_step(page, step0), 120)
            shown = time.perf_counter() - t0
            out["first page"].append(shown)
            out["first page, cold kernel"].append(imported + shown)
            out["kernel import"].append(imported)
            if session < sessions - 1:
                continue
            out["snapshot switch"] = snapshot_switches(page, rounds)
            out["new step"] = [new_step(page, root / "live", step0 + 1 + i) for i in range(rounds)]
            cells.nth(3).click()
            page.keyboard.press("Shift+Enter")
            time.sleep(2)
            out["new step, kernel busy"] = [new_step(page, root / "live", step0 + rounds + 1 + i) for i in range(rounds)]
    return out


def summary(samples: dict) -> dict:
    "Each measure's median, and its ratio to the goal of its kind."
    out = {}
    for name, values in samples.items():
        values = values if isinstance(values, list) else [values]
        median = statistics.median(values)
        goal = next((g for k, g in GOALS.items() if name.startswith(k)), None)   # "kernel import": none, a part of one
        out[name] = {"median_s": round(median, 3), "goal_s": goal, "over_goal": goal and round(median / goal, 2), "n": len(values)}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--sessions", type=int, default=3, help="fresh JupyterLab sessions for the inline first page")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        root = folder / "runs"
        write_training_run(root / "live")
        samples = {"served": served(root, a.rounds)}
        samples["inline"] = inline(folder, root, a.rounds, STEPS + a.rounds, a.sessions)
    result = {"rounds": a.rounds, "sessions": a.sessions, "steps": STEPS, **{k: summary(v) for k, v in samples.items()}, "seconds": samples}
    for where in ("served", "inline"):
        for name, s in result[where].items():
            goal = "(no goal)" if s["goal_s"] is None else f"goal {s['goal_s']:.0f} s   x{s['over_goal']:.2f}"
            print(f"{where:7s} {name:24s} median {s['median_s']:6.2f} s   {goal}")
    if a.out:
        write_json(a.out, {**provenance(shlex.join(["python", *sys.argv])), **result})
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}))


if __name__ == "__main__":
    main()
