"""`panel serve dashboards/` over a runs root holding a huge run: does the server answer everything else while one
session reads it, and does it stop on SIGTERM?

    python bench/big_run_server.py [--mb 200] [--out results/bench/big_run_server.json]

A runs root with "big" (a metrics.jsonl of --mb MB: 10 training metrics a step, about 190k steps at 200 MB) and
"small" (its first 100 lines). The server is started and warmed up by one page of "small" (its first session
imports the library); then, each timed from its request until its last byte:
  big page            the page of ?run=big (the session's document: build_app, one budgeted read of the log);
  static meanwhile    a static file asked for every second while that page is built and then while its session
                      reads the rest of the log (6 of them), the largest of them reported;
  other page          ?run=small, asked for 5 times after that, the largest reported;
  caught up           in headless Chromium, the page of ?run=big until its step pane shows the run's last step;
  SIGTERM             from the signal until the server process has exited.
The last line is one JSON object; --out also writes it with what made it.
"""
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from matryoshka_lab.core import provenance  # noqa: E402
from matryoshka_lab.runs import write_json  # noqa: E402
from page_latency import shows_step, until  # noqa: E402
from test_dashboards import chromium_page, free_port  # noqa: E402

NAMES = ["loss", "lr", "grad_norm", *(f"L6/d{d}/infonce" for d in (16, 32, 64, 128, 256, 384)), "mrl"]


def write_big_run(root: Path, mb: int) -> int:
    "root/big with a metrics.jsonl of about mb MB, root/small with its first 100 lines; the big run's last step."
    (root / "big").mkdir(parents=True)
    (root / "small").mkdir()
    with open(root / "big" / "metrics.jsonl", "w") as f:
        step = 0
        while f.tell() < mb << 20:
            step += 1
            f.write("".join(json.dumps({"step": step, "time": step / 10, "split": "train", "name": n, "value": 1 / step})
                            + "\n" for n in NAMES))
    with open(root / "big" / "metrics.jsonl") as f:
        (root / "small" / "metrics.jsonl").write_text("".join(next(f) for _ in range(100)))
    return step


def fetch(port: int, path: str) -> float:
    "Seconds until the whole answer to GET path came."
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=600) as r:
        r.read()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    static = "/static/extensions/panel/css/loading.css"
    with tempfile.TemporaryDirectory() as tmp:
        root, port = Path(tmp) / "runs", free_port()
        last = write_big_run(root, a.mb)
        cmd = ["panel", "serve", "dashboards/", "--address", "127.0.0.1", "--port", str(port),
               "--allow-websocket-origin", f"127.0.0.1:{port}"]
        with open(Path(tmp) / "panel.log", "wb") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "MATRYOSHKA_LAB_RUNS": str(root)},
                                    stdout=log, stderr=subprocess.STDOUT)
        try:
            if until(lambda: proc.poll() is not None or _answers(port, static), 120) == float("inf"):
                raise SystemExit("error: the server did not start in 120 s")
            out = {"log_mb": round((root / "big" / "metrics.jsonl").stat().st_size / 2**20, 1), "steps": last,
                   "warm-up page": fetch(port, "/dashboards?run=small")}
            got = {}
            page = threading.Thread(target=lambda: got.setdefault("big", fetch(port, "/dashboards?run=big")))
            page.start()
            meanwhile = []
            for _ in range(6):
                time.sleep(1.0)
                meanwhile.append(fetch(port, static))
            page.join()
            out.update({"big page": got["big"], "static meanwhile (max)": max(meanwhile),
                        "other page (max)": max(fetch(port, "/dashboards?run=small") for _ in range(5))})
            with chromium_page(1500, 1100) as browser:
                t0 = time.perf_counter()
                browser.goto(f"http://127.0.0.1:{port}/dashboards?run=big", timeout=120_000)
                until(shows_step(browser, last), 600)
                out["caught up"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
                out["SIGTERM"] = time.perf_counter() - t0
            except subprocess.TimeoutExpired:
                out["SIGTERM"] = float("inf")
        finally:
            if proc.poll() is None:
                proc.kill()
    out = {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}
    for k, v in out.items():
        print(f"{k:24s} {v}{'' if k in ('log_mb', 'steps') else ' s'}")
    if a.out:
        write_json(a.out, {**provenance(shlex.join(["python", *sys.argv])), **out})
    print(json.dumps(out))


def _answers(port: int, path: str) -> bool:
    try:
        fetch(port, path)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
