"""The served workbench's first page, this tree beside another revision of it (default 10b77bc, the last whose page
loaded plotly.js), in headless Chromium (a new profile each page, nothing cached), rounds interleaved.

    python bench/page_weight.py [--rounds 5] [--against REV] [--out results/bench/page_weight.json]

The run is bench/page_latency.py's (300 steps, a 7 x 6 grid, three snapshots). Each tree serves it with its own
`panel serve dashboards/` (the other revision from a `git archive` of it, imported through PYTHONPATH: its own
requirements must be installed, plotly for 10b77bc). Each page is timed from navigation until its step pane shows the
run's last step, with its server response (the session's document: build_app), DOMContentLoaded (every script
fetched and run) and the JavaScript it fetched, by library. The last line is one JSON object; --out also writes it
with what made it.
"""
import argparse
import json
import shlex
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_dashboards  # noqa: E402
from matryoshka_lab.core import provenance  # noqa: E402
from matryoshka_lab.runs import write_json  # noqa: E402
from page_latency import STEPS, shows_step, until, write_training_run  # noqa: E402

RESOURCES = "performance.getEntriesByType('resource').map(e => [e.name, e.decodedBodySize])"


def library(url: str) -> str:
    "A script's library, from its path under static/extensions or bokeh's static folder."
    path = url.split("?")[0]
    for name in ("plotly", "vega-lite", "vega-embed", "vega", "maplibre", "es-module-shims"):
        if name in path:
            return name
    return "bokeh + panel" if path.endswith(".js") else "other"


def first_page(port: int) -> dict:
    "One page in a new Chromium: seconds until the last step shows, the server's response, DOMContentLoaded, and the JS bytes by library."
    with test_dashboards.chromium_page(1500, 1100) as page:
        t0 = time.perf_counter()
        page.goto(f"http://127.0.0.1:{port}/dashboards?run=live", timeout=120_000)
        until(shows_step(page, STEPS), 120)
        shown = time.perf_counter() - t0
        nav = page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()")
        js = {}
        for url, size in page.evaluate(RESOURCES):
            if url.split("?")[0].endswith(".js") or "vegaplot" in url:
                js[library(url)] = js.get(library(url), 0) + size
    return {"step shown": shown, "server response": nav["responseStart"] / 1000,
            "DOMContentLoaded": nav["domContentLoadedEventEnd"] / 1000, "js_bytes": js}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--against", default="10b77bc", help="the git revision served beside this tree")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, other = Path(tmp), Path(tmp) / "other"
        write_training_run(folder / "runs" / "live")
        other.mkdir()
        subprocess.run(f"git archive {shlex.quote(a.against)} | tar -x -C {shlex.quote(str(other))}", shell=True, cwd=ROOT,
                       check=True)
        names = ("this tree", a.against)
        pages, ports = {n: [] for n in names}, {n: test_dashboards.free_port() for n in names}
        with test_dashboards.serve(folder / "runs", ports[names[0]]):
            test_dashboards.ROOT, before = other, os.environ.get("PYTHONPATH")   # the other server: its tree, its library
            os.environ["PYTHONPATH"] = str(other)
            try:
                with test_dashboards.serve(folder / "runs", ports[names[1]]):
                    for name in pages:                          # a first session each, not counted
                        first_page(ports[name])
                    for _ in range(a.rounds):
                        for name in pages:
                            pages[name].append(first_page(ports[name]))
            finally:
                test_dashboards.ROOT = ROOT
                os.environ.pop("PYTHONPATH") if before is None else os.environ.update(PYTHONPATH=before)
    result = {"rounds": a.rounds, "steps": STEPS, "against": a.against}
    for name, got in pages.items():
        result[name] = {k: round(statistics.median(g[k] for g in got), 3)
                        for k in ("step shown", "server response", "DOMContentLoaded")}
        result[name]["js_bytes"] = got[0]["js_bytes"]
    result["ratio step shown"] = round(result[names[0]]["step shown"] / result[names[1]]["step shown"], 2)
    for name in pages:
        r = result[name]
        print(f"{name:13s} step shown {r['step shown']:5.2f} s   server response {r['server response']:5.2f} s   "
              f"DOMContentLoaded {r['DOMContentLoaded']:5.2f} s   JS {sum(r['js_bytes'].values()) / 1e6:5.2f} MB")
    print(f"this tree / {a.against}: x{result['ratio step shown']:.2f} (medians of {a.rounds} pages each)")
    if a.out:
        write_json(a.out, {**provenance(shlex.join(["python", *sys.argv])), **result})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
