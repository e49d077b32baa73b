"""The dashboards: the Panel-free core against naive re-reads, path safety, edge cases, and real browser tests of the
served workbench and of the same workbench inline in a JupyterLab notebook (matryoshka_lab.workbench.show).

The browser tests need Debian's chromium and Playwright for Python; they are skipped without them unless
MATRYOSHKA_LAB_REQUIRE_BROWSER=1 (set by .ci/run), in which case they fail. Screenshots go to tests/artifacts/.
"""
import base64
import concurrent.futures
import contextlib
import itertools
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from matryoshka_lab import grid_tabs
from matryoshka_lab import workbench as dash
from matryoshka_lab.dashboard import MetricsTail, load_snapshot, resolve_run, run_file, safe_runs
from matryoshka_lab.runs import RunLog, parse_metrics

ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def write_grid(path):
    "An STS grid, and a retrieval task's nDCG@10 at three stored precisions (what the Budget tab reads)."
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [("stsb", l, d, "spearman", 50.0 + l + d / 100) for l in range(3) for d in (16, 32)]
    rows += [("paraphrase", l, d, "ndcg_at_10" + ("" if p == "float32" else f"/{p}"), 60.0 + 5 * l + d / 16 - drop)
             for l in (1, 2) for d in (16, 32) for p, drop in (("float32", 0), ("int8", 0.5), ("binary", 8))]
    pd.DataFrame(rows, columns=["task", "layer", "dim", "metric", "value"]).to_csv(path, index=False)


def write_run(path, steps=range(1, 6), nan_at=3, snapshots=True, config=None):
    "A small run: loss and parts (one NaN), an eval metric, and diagnostics snapshots."
    log = RunLog(path, config=config or {"dims": [2, 4, 8]})
    rng = np.random.default_rng(0)
    for s in steps:
        log.log_many(s, {"loss": 1 / s, "mrl": float("nan") if s == nan_at else 2 / s, "L2/d4/info_nce": 0.5 / s})
        log.log(s, "stsb_dev/L2/d4/spearman", 60 + s, split="eval")
        if snapshots:
            log.save_array("diag_variance", s, rng.random((3, 8)))
            log.save_array("diag_xcorr", s, rng.uniform(-1, 1, (2, 6)))
            log.save_array("diag_cka_layers", s, rng.random((3, 3)))
            log.save_array("nc1", s, rng.random((3, 3)))
    log.close()
    return path


BIG_NAMES = [f"L{l}/d{d}/info_nce" for l in (2, 4, 6) for d in (16, 32, 64, 128)] + ["loss"]


def live_runs(folder: Path) -> Path:
    "folder/runs holding the run `live` of write_run (dims 2, 4, 8): the runs root the browser tests open."
    write_run(folder / "runs" / "live", config={"dims": [2, 4, 8]})
    return folder / "runs"


def write_big_log(path, n, null_every=997):
    "n training records cycling over BIG_NAMES (13 metrics a step), every null_every-th value null (NaN)."
    with open(path, "w") as f:
        for i in range(n):
            step, k = divmod(i, len(BIG_NAMES))
            value = None if i % null_every == 0 else (i % 1000) / 1000
            f.write(json.dumps({"step": step, "time": i / 100, "split": "train", "name": BIG_NAMES[k], "value": value}) + "\n")
    return Path(path)


def naive(text):
    "What re-reading the whole file shows: parse_metrics, in MetricsTail.frame's layout."
    df = parse_metrics(text)[["split", "name", "step", "value"]]
    return df.sort_values(["split", "name", "step"], ignore_index=True)


def assert_same(tail, text):
    a = tail.frame().sort_values(["split", "name", "step"], ignore_index=True)
    b = naive(text)
    assert a[["split", "name", "step"]].astype(str).values.tolist() == b[["split", "name", "step"]].astype(str).values.tolist()
    np.testing.assert_array_equal(a.value.to_numpy(float), b.value.to_numpy(float))


# ---- the core against naive re-reads ----
def test_tail_matches_full_reread_at_any_cut(tmp_path):
    "The file grows in random byte-sized pieces (lines cut anywhere, garbage, NaN); after every poll the tail equals a re-read."
    rng = random.Random(0)
    lines = []
    for step in range(1, 120):
        for name in ("loss", "L1/d4/x"):
            v = rng.choice([rng.random(), None, float("nan")]) if step % 7 == 0 else rng.random()
            lines.append(json.dumps({"step": step, "time": step / 10, "split": "train", "name": name, "value": v}))
        if step % 17 == 0:
            lines.append('{"step": oops')
    text = "\n".join(lines) + "\n"
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    tail, pos = MetricsTail(path), 0
    while pos < len(text):
        cut = min(len(text), pos + rng.randint(1, 300))
        with open(path, "a") as f:
            f.write(text[pos:cut])
        pos = cut
        tail.poll()
        written = text[:pos]
        assert_same(tail, written[:written.rfind("\n") + 1])     # the incomplete last line waits for its newline
        assert tail.offset == written.rfind("\n") + 1
    assert tail.bad == 119 // 17 and tail.last_step == 119


def test_tail_survives_truncation_replacement_and_deletion(tmp_path):
    path = write_run(tmp_path / "run", snapshots=False) / "metrics.jsonl"
    tail = MetricsTail(path)
    tail.poll()
    full = path.read_text()
    path.write_text(full[: len(full) // 3])                        # truncated below the offset: start again
    tail.poll()
    cut = path.read_text()
    assert_same(tail, cut[: cut.rfind("\n") + 1])
    assert tail.restarts == 1
    path.unlink()                                                   # deleted: quiet, keeps what it had
    assert tail.poll() == 0 and tail.missing
    assert len(tail.frame()) > 0
    path.write_text(full)                                           # written again: read from byte 0
    tail.poll()
    assert_same(tail, full)
    assert not tail.missing


def test_tail_100k_lines_initial_read_and_one_tick(tmp_path):
    "100k lines: one poll reads max_bytes, one with an unbounded budget all of it, equal to a full re-read on the exact latest values; memory stays bounded, a tick reads only new lines."
    path = write_big_log(tmp_path / "metrics.jsonl", 100_000)
    once = MetricsTail(path, max_points=2000)
    assert 0 < once.poll() < 100_000 and once.max_bytes - 1000 < once.offset <= once.max_bytes   # up to its last whole line
    tail = MetricsTail(path, max_points=2000)
    assert tail.poll(float("inf")) == 100_000 and tail.offset == path.stat().st_size
    df = parse_metrics(path.read_text())
    want = df.sort_values("step").groupby("name").tail(1).set_index("name")
    got = tail.latest().loc["train"]
    assert sorted(got.index) == sorted(want.index)
    np.testing.assert_array_equal(got.loc[want.index, "value"].to_numpy(), want["value"].to_numpy())
    np.testing.assert_array_equal(got.loc[want.index, "step"].to_numpy(), want["step"].to_numpy())
    for (_, name), s in tail.series.items():                        # thinned by the documented rule
        n = int((df.name == name).sum())
        stride = 1
        while math.ceil(n / stride) > 2000:
            stride *= 2
        assert s.stride == stride > 1 and len(s.steps) == math.ceil(n / stride) <= 2000
        np.testing.assert_array_equal(np.frombuffer(s.steps, np.int64), df[df.name == name].step.to_numpy()[::stride])
    with open(path, "a") as f:
        for k in range(10):
            f.write(json.dumps({"step": 10_000 + k, "split": "train", "name": "loss", "value": 0.5}) + "\n")
    size_before = tail.offset
    assert tail.poll() == 10 and tail.offset - size_before == len(path.read_bytes()) - size_before
    assert tail.series[("train", "loss")].last == (10_009, 0.5) and tail.last_step == 10_009


# ---- path safety ----
def test_runs_root_refuses_traversal_and_symlinks(tmp_path):
    root = (tmp_path / "runs")
    write_run(root / "sweep" / "mrl", snapshots=False)
    write_run(tmp_path / "outside", snapshots=False)
    (root / "escape").symlink_to(tmp_path / "outside")             # a symlinked directory leading out
    (root / "fake").mkdir()
    (root / "fake" / "metrics.jsonl").symlink_to(tmp_path / "outside" / "metrics.jsonl")
    (root / "loop").symlink_to(root / "loop")                      # a symlink loop
    assert safe_runs(root) == ["sweep/mrl"]
    for bad in ["..", "../outside", "sweep/../../outside", str(tmp_path / "outside"), "escape", "", "loop"]:
        with pytest.raises(ValueError):
            resolve_run(root, bad)
    with pytest.raises(ValueError, match="leads outside"):
        run_file(root, "fake", "metrics.jsonl")
    wb = dash.build_app(root, run="../outside")       # a run asked for by URL must be a listed one
    assert wb.picker.value == "sweep/mrl"
    wb.open_run("escape")
    assert wb.tail is None and "refused" in wb.status.object
    np.save(root / "sweep" / "mrl" / "evil.npy", np.array([object()], dtype=object))
    (root / "sweep" / "mrl" / "arrays" / "x").mkdir(parents=True)
    shutil.copy(root / "sweep" / "mrl" / "evil.npy", root / "sweep" / "mrl" / "arrays" / "x" / "step_0000001.npy")
    with pytest.raises(ValueError, match="allow_pickle"):            # nothing is ever unpickled
        load_snapshot(root / "sweep" / "mrl", "x", 1)


def test_only_local_clients_by_default():
    from matryoshka_lab.serving import client_allowed as allowed
    assert allowed("127.0.0.1", {}) and allowed("::1", {})
    assert not allowed("192.168.1.5", {}) and not allowed(None, {}) and not allowed("garbage", {})
    assert allowed("192.168.1.5", {"MATRYOSHKA_LAB_ALLOW_REMOTE": "1"})


# ---- the app builds and ticks on what a runs root may hold ----
def test_finds_grids_and_refuses_escapes(tmp_path):
    root = tmp_path / "runs"
    write_grid(root / "demo" / "grid.csv")
    write_grid(tmp_path / "outside" / "grid.csv")
    (root / "sneaky").mkdir()
    (root / "sneaky" / "grid.csv").symlink_to(tmp_path / "outside" / "grid.csv")
    assert list(grid_tabs.find_grids(root.resolve())) == ["demo/grid.csv"]
    app = dash.build_app(root.resolve())
    assert "workbench" in app.layout[0].object and app.picker.options == []   # a folder holding only a grid is no run ...
    assert [v.picker.select.options for v in app.grid_views] == [["demo/grid.csv"]] * 2   # ... but a grid of both grid tabs


def test_bad_files_do_not_crash(tmp_path):
    bad = tmp_path / "grid.csv"
    bad.write_text("task,layer,dim,metric,value\nstsb,0,16,spearman,5")   # half-written last line
    assert len(grid_tabs.read_grid(bad, tmp_path)) == 1
    bad.write_text("not,a,grid\n1,2,3\n")
    assert grid_tabs.read_grid(bad, tmp_path).empty
    assert grid_tabs.read_grid(tmp_path / "missing.csv", tmp_path).empty
    wb = dash.build_app(tmp_path / "none")
    assert "No runs under the runs root" in wb.layout[0].object
    wb.tick()
    assert wb.step.object == "step -"


def test_app_on_empty_nan_halfwritten_and_deleted_runs(tmp_path):
    root = tmp_path / "runs"
    (root / "empty").mkdir(parents=True)
    (root / "empty" / "config.json").write_text("{}")                # a run that has not logged anything
    write_run(root / "live")
    with open(root / "live" / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "time": 1.0, "split": "train", "na')     # half-written last line
    wb = dash.build_app(root, run="empty")
    assert wb.step.object == "step -" and "missing" in wb.status.object
    wb.tick()
    wb.picker.value = "live"
    assert wb.step.object == "step 5" and "loss" in wb.train_choice.value
    assert "stsb_dev/L2/d4/spearman" in wb.eval_choice.value
    mrl = wb.train_plot.object.data.query("name == 'mrl'")
    assert np.isnan(mrl.raw.to_numpy(float)).sum() == 1                # the NaN is a gap, not a crash
    assert list(wb.array_select.values) == ["diag_cka_layers", "diag_variance", "diag_xcorr", "nc1"]
    assert list(wb.snap_slider.options) == [1, 2, 3, 4, 5] and wb.snap_slider.value == 5
    for name in wb.array_select.values:
        wb.array_select.value = name
        assert "step 5" in wb.snap_plot.object.title.text
    wb.snap_slider.value = 2
    assert "step 2" in wb.snap_plot.object.title.text
    with open(root / "live" / "metrics.jsonl", "a") as f:
        f.write('ue": 1}\n{"step": 7, "time": 1.0, "split": "train", "name": "loss", "value": NaN}\n')
    wb.tick()
    assert wb.step.object == "step 7"
    wb.cmp_runs.value = ["live", "empty"]
    wb.cmp_pattern.value = "loss"
    assert "Δ empty" in wb.cmp_table.object
    shutil.rmtree(root / "live")                                        # deleted while open
    for _ in range(dash.SLOW_EVERY + 1):
        wb.tick()
    assert "missing" in wb.status.object and "error" not in wb.status.object
    assert wb.step.object == "step 7" and "live" in wb.picker.options
    wb.compare()


def special_files_root(root: Path) -> Path:
    "A runs root whose runs hold special files: a FIFO metrics.jsonl (y), a config.json linked to /dev/zero, a FIFO grid.csv"
    " and a FIFO result JSON beside a normal log (z), a FIFO snapshot (w)."
    (root / "y").mkdir(parents=True)
    os.mkfifo(root / "y" / "metrics.jsonl")
    write_run(root / "z", snapshots=False)
    (root / "z" / "config.json").unlink()
    (root / "z" / "config.json").symlink_to("/dev/zero")
    os.mkfifo(root / "z" / "grid.csv")
    os.mkfifo(root / "z" / "result.json")
    write_run(root / "w")
    fifo = root / "w" / "arrays" / "diag_variance" / "step_0000009.npy"
    os.mkfifo(fifo)
    return root


def test_special_files_never_block_the_workbench(tmp_path):
    "Every view over a root of FIFOs and a /dev/zero symlink answers (in a child process, so a block fails the test)."
    root = special_files_root(tmp_path / "runs")
    code = f"""
from matryoshka_lab import workbench as dash
from matryoshka_lab.grid_tabs import find_grids
wb = dash.build_app({str(root)!r}, run="y")
wb.tick()
print("y:", wb.step.object, "|", wb.status.object)
wb.picker.value = "z"
wb.tick()
print("z:", wb.step.object, "|", wb.config, "|", wb.steer_select.options)
wb.picker.value = "w"
wb.array_select.value = "diag_variance"
print("w:", list(wb.snap_slider.options), "|", wb.snap_plot.object.title.text)
print("grids:", list(find_grids(wb.root)))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in res.stdout.strip().splitlines())
    assert lines["y"] == "step - | metrics.jsonl is missing (run not started, or deleted) or not a regular file: showing what was read"
    assert lines["z"] == "step 5 | {} | []"            # the log is read; the /dev/zero config and the FIFO result are not
    assert lines["grids"] == "[]"                      # a FIFO grid.csv is not a grid
    # the FIFO snapshot is listed by name, but drawing it is refused, never waited on
    assert lines["w"] == "[1, 2, 3, 4, 5, 9] | diag_variance at step 9: cannot read (ValueError)"
    with pytest.raises(ValueError, match="step_0000009.npy is not a regular file"):
        load_snapshot(root / "w", "diag_variance", 9)


def test_served_workbench_answers_beside_special_files(tmp_path):
    "`panel serve` with ?run= a FIFO log or a /dev/zero config answers, its static files too, and SIGTERM ends it."
    root = special_files_root(tmp_path / "runs")
    port = free_port()
    with serve(root, port) as (proc, _):
        for run in ("y", "z", "w"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboards?run={run}", timeout=60) as r:
                assert r.status == 200 and "matryoshka_lab" in r.read().decode()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/static/extensions/panel/panel.min.js", timeout=60) as r:
            assert r.status == 200
        proc.terminate()
        assert proc.wait(timeout=20) is not None


def test_dashboard_imports_no_torch():
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('m', 'dashboards/main.py'); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.build_app('/nonexistent'); "
            "print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "False"


# ---- the server ----
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(cmd, url, log, env=None):
    "Start a server process (its output into the file log), yield (process, body of url) once it answers, then stop it."
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        body, deadline = None, time.time() + 90
        while time.time() < deadline and body is None and proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.5)
        assert body is not None, Path(log).read_text(errors="replace")[-2000:]
        yield proc, body
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def serve(runs, port):
    "`panel serve dashboards/` on localhost, runs under `runs`."
    cmd = ["panel", "serve", "dashboards/", "--address", "127.0.0.1", "--port", str(port),
           "--allow-websocket-origin", f"127.0.0.1:{port}"]
    return running(cmd, f"http://127.0.0.1:{port}/dashboards", Path(runs).parent / "panel.log",
                   {**os.environ, "MATRYOSHKA_LAB_RUNS": str(runs)})


def jupyter_lab(folder, port):
    "JupyterLab on localhost serving `folder` (token t)."
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--IdentityProvider.token=t", f"--ServerApp.root_dir={folder}", "--allow-root",
           f"--LabApp.workspaces_dir={folder}/.lab_workspaces"]   # no layout left over from another session
    return running(cmd, f"http://127.0.0.1:{port}/api?token=t", Path(folder) / "lab.log")


def test_panel_serve_answers_on_localhost(tmp_path):
    write_grid(tmp_path / "runs" / "demo" / "grid.csv")
    with serve(tmp_path / "runs", free_port()) as (_, body):
        assert "matryoshka_lab" in body


# ---- the real browser ----
def browser_or_skip():
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append("Debian's chromium (apt-get install chromium chromium-driver)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright for Python (pip install playwright)")
    if missing:
        msg = "the browser test needs " + " and ".join(missing)
        if os.environ.get("MATRYOSHKA_LAB_REQUIRE_BROWSER") == "1":
            pytest.fail(msg + " (MATRYOSHKA_LAB_REQUIRE_BROWSER=1)")
        pytest.skip(msg)


@contextlib.contextmanager
def chromium_page(width=1400, height=1100, flags=()):
    "A page of Debian's headless Chromium (a new empty profile, CHROMIUM_FLAGS and `flags`), driven by Playwright; closed afterwards."
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[*CHROMIUM_FLAGS, *flags])
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def shown(locator) -> str:
    "Text of a Panel pane: its content lives in the element's shadow root."
    return locator.evaluate("e => (e.shadowRoot ? e.shadowRoot.textContent : '') + e.textContent")


WRITER = """
import sys, time
from matryoshka_lab.runs import RunLog
log = RunLog(sys.argv[1])
log.log_many(int(sys.argv[2]), {"loss": 0.01, "mrl": float("nan")})
log.close()
print(time.time(), flush=True)
"""


def wait_shown(locator, text, seconds=20):
    deadline = time.time() + seconds
    while text not in shown(locator) and time.time() < deadline:
        time.sleep(0.1)
    assert text in shown(locator), shown(locator)


def settled_size(page, quiet: float = 1.0, limit: float = 15.0) -> list:
    "The page's [scroll width, scroll height] once unchanged for `quiet` seconds (figures resize to their containers after they first draw, later on a loaded machine), at most `limit` seconds."
    js = "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
    last, since, end = page.evaluate(js), time.monotonic(), time.monotonic() + limit
    while time.monotonic() < end:
        time.sleep(0.25)
        now = page.evaluate(js)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def seconds_to_show(step, run_dir, n) -> float:
    "Another process writes step n into run_dir; seconds until the step pane shows it (at most 2 allowed)."
    res = subprocess.run([sys.executable, "-c", WRITER, str(run_dir), str(n)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    written = float(res.stdout.split()[-1])
    while f"step {n}" not in shown(step) and time.time() - written < 5:
        time.sleep(0.02)
    seen = time.time() - written
    assert f"step {n}" in shown(step), shown(step)
    assert seen <= 2.0, f"the new step appeared {seen:.2f} s after it was written"
    return seen


def test_browser_shows_new_step_within_2s(tmp_path):
    "Headless Chromium has the page open; another process writes a step; the page shows it within 2 seconds; each tab fits the window and draws its altair figures (Snapshots' steerability curves, Budget's frontier) once shown."
    browser_or_skip()
    runs = live_runs(tmp_path)
    with open(runs / "live" / "metrics.jsonl", "a") as f:          # diagnostics' scalars, as a real run logs them
        for s, kind, l, d in itertools.product(range(1, 6), ("erank", "cv", "cka_prefix", "uniformity"), range(7), (2, 4, 8)):
            f.write(json.dumps({"step": s, "time": s, "split": "eval", "name": f"diag/{kind}/L{l}/d{d}", "value": l * d}) + "\n")
    write_run(runs / "other", steps=range(1, 4), snapshots=False)
    with open(runs / "other" / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "na')                                  # half-written last line
    write_grid(runs / "live" / "grid.csv")
    shutil.copy(ROOT / "results" / "fractal" / "clinc150" / "authors.json", runs / "live" / "clinc150.json")   # a Fractal result
    drawn = {"Snapshots": (".ml-steerability", "clinc150.json: accuracy per level against prefix size"),
             "Budget": (".ml-frontier", "quality per byte")}                # altair figures: Vega draws SVG, text on the page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with serve(runs, port), chromium_page(1500, 1100) as page:
        page.goto(f"http://127.0.0.1:{port}/dashboards", timeout=60_000)
        step = page.locator(".ml-step")
        step.wait_for(timeout=60_000)
        page.locator("select").first.select_option("other")     # the run picker
        wait_shown(step, "step 3")
        page.locator("select").first.select_option("live")
        wait_shown(step, "step 5")
        seen = seconds_to_show(step, runs / "live", 42)
        time.sleep(1.2)                                          # let the curves redraw (at most once a second)
        sizes = {"Monitor": settled_size(page)}
        page.screenshot(path=str(ARTIFACTS / "monitor.png"), full_page=True)
        for tab in ("Snapshots", "Compare", "Grids", "Budget"):
            page.get_by_text(tab, exact=True).first.click()
            time.sleep(1.5)
            if tab in drawn:                                         # the tab's altair figure, drawn once it is shown
                wait_shown(page.locator(f"{drawn[tab][0]} svg.marks").first, drawn[tab][1])
            sizes[tab] = settled_size(page)
            page.screenshot(path=str(ARTIFACTS / f"{tab.lower()}.png"), full_page=True)
        assert page.get_by_text("Cheapest within 1.0% of the full model").count() == 1   # the Budget tab's advice
        page.get_by_text("Compare", exact=True).first.click()
        box = page.get_by_placeholder("the eval grid at the last layer")   # the metric pattern
        box.fill("*")                                            # all 88 metrics: the table scrolls, the bars are cut
        box.press("Enter")
        page.get_by_text("metrics matching *").first.wait_for(timeout=20_000)
        time.sleep(1.5)
        sizes["Compare *"] = settled_size(page)
        page.screenshot(path=str(ARTIFACTS / "compare_all.png"), full_page=True)
        print("page width x height per tab at a 1500 x 1100 window:", sizes)
        # every tab uses the window: no sideways scrolling, and at most a short scroll down (three figures were 4,700 px)
        assert all(w <= 1500 and h <= 1500 for w, h in sizes.values()), sizes
        print(f"new step shown {seen:.3f} s after the write")


def test_browser_runs_grids_compare_and_hints_as_a_researcher_expects(tmp_path):
    "The served app: a folder holding only a grid is no run; Compare sets two methods' runs at a step both have and says they train different methods; a grid written after the page opened appears; the Snapshots tab says what produces steerability and NC1; the curves have a smoothing control."
    browser_or_skip()
    runs = tmp_path / "runs"
    for name, method, last in (("nb_mrl", "mrl", 8), ("cli_2dmse", "2dmse", 6)):
        log = RunLog(runs / name, config={"dims": [2, 4, 8], "method": method})
        for s in range(1, last + 1):
            log.log(s, "loss", 1 / s)
            if s % 4 == 0:
                log.log(s, "stsb_dev/L2/d4/spearman", 60 + s, split="eval")
        log.close()
    write_grid(runs / "budget" / "grid.csv")                        # a retrieval grid alone, as the README's Budget command
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with serve(runs, port), chromium_page(1500, 1100) as page:
        page.goto(f"http://127.0.0.1:{port}/dashboards", timeout=60_000)
        page.locator(".ml-step").wait_for(timeout=60_000)
        runs_menu = page.locator("select").first.locator("option").all_inner_texts()
        assert runs_menu == ["cli_2dmse", "nb_mrl"], runs_menu             # budget/ is a grid, not a run
        page.get_by_text("Smoothing (training curves)").first.wait_for(timeout=10_000)
        page.get_by_text("Snapshots", exact=True).first.click()
        page.get_by_text("Steerability curves come from a Fractal result").first.wait_for(timeout=10_000)
        assert page.get_by_text("measured on a labelled probe by distillation runs").count() == 1
        page.get_by_text("Compare", exact=True).first.click()
        box = page.get_by_placeholder("the eval grid at the last layer")   # the metric pattern
        box.fill("*")
        box.press("Enter")
        page.get_by_text("The runs train different methods").first.wait_for(timeout=20_000)   # train rows: the losses
        assert page.get_by_text("as of the last step all the runs have reached").count() == 1
        row = page.locator("tr:has-text('eval: stsb_dev/L2/d4/spearman')").first.inner_text().split("\t")
        assert [c.strip() for c in row[1:]] == ["4", "64", "64", "0"], row        # as of step 4, not 8 against 4
        page.screenshot(path=str(ARTIFACTS / "compare_aligned.png"), full_page=True)
        write_grid(runs / "later" / "grid.csv")                     # written after the page opened
        page.get_by_text("Grids", exact=True).first.click()
        grid_menu = page.locator("select:has(option:text-is('budget/grid.csv')) >> visible=true").first   # the Grids tab's
        deadline = time.time() + 15
        while "later/grid.csv" not in grid_menu.locator("option").all_inner_texts() and time.time() < deadline:
            time.sleep(0.5)
        assert "later/grid.csv" in grid_menu.locator("option").all_inner_texts()


def test_browser_survives_big_nan_empty_halfwritten_and_deleted_runs(tmp_path):
    "The page stays live through a 100k-line log, an all-NaN run, an empty run, a half-written line and a run deleted while open."
    browser_or_skip()
    runs = tmp_path / "runs"
    (runs / "big").mkdir(parents=True)
    write_big_log(runs / "big" / "metrics.jsonl", 100_000)
    last = (100_000 - 1) // len(BIG_NAMES)
    log = RunLog(runs / "nan")
    for s in range(1, 4):
        log.log_many(s, {"loss": float("nan"), "mrl": float("inf")})
    log.close()
    (runs / "empty").mkdir()
    (runs / "empty" / "config.json").write_text("{}")
    write_run(runs / "live")
    with open(runs / "live" / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "time": 1.0, "split": "train", "na')     # half-written last line
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with serve(runs, port) as (server, _), chromium_page() as page:
        page.goto(f"http://127.0.0.1:{port}/dashboards?run=big", timeout=60_000)
        step, status, picker = page.locator(".ml-step"), page.locator(".ml-status"), page.locator("select").first
        wait_shown(step, f"step {last}", seconds=60)
        seconds_to_show(step, runs / "big", last + 1)              # 100k lines: the page still follows within 2 s
        page.screenshot(path=str(ARTIFACTS / "robust_big.png"), full_page=True)
        picker.select_option("nan")
        wait_shown(step, "step 3")
        picker.select_option("empty")
        wait_shown(step, "step -")
        wait_shown(status, "missing")
        picker.select_option("live")
        wait_shown(step, "step 5")                                  # the half-written step 6 waits for its newline
        shutil.rmtree(runs / "live")                                # deleted while open
        wait_shown(status, "missing", seconds=dash.SLOW_EVERY * dash.PERIOD_MS / 1000 + 10)
        time.sleep(dash.SLOW_EVERY * dash.PERIOD_MS / 1000 + 1)     # a slow tick re-lists runs and snapshots
        assert "error while refreshing" not in shown(status) and "step 5" in shown(step)
        page.screenshot(path=str(ARTIFACTS / "robust_deleted.png"), full_page=True)
        picker.select_option("big")
        wait_shown(step, f"step {last + 1}")
        seconds_to_show(step, runs / "big", last + 2)              # still live after all of the above
        assert server.poll() is None
        served = (runs.parent / "panel.log").read_text(errors="replace")   # before the browser leaves
        assert "Traceback" not in served, served[-3000:]


NOTEBOOK = {"cells": [{"cell_type": "code", "execution_count": None, "id": "c0", "metadata": {}, "outputs": [],
                       "source": "from matryoshka_lab.workbench import show\nshow({root!r}, 'live')"}],
            "metadata": {"kernelspec": {"display_name": "python3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def seed_runs(runs: Path) -> Path:
    "Three seeds of MRL and a base run, evaluated at steps 4 and 8 on a 3-layer x 3-dim grid; MRL's third seed killed 3 cells into step 8."
    for name, cfg, shift in [(f"mrl_s{s}", {"dims": [4, 8, 16], "method": "mrl", "seed": s}, s) for s in range(3)] \
            + [("base", {"dims": [4, 8, 16], "method": "base", "seed": 0}, -3)]:
        log = RunLog(runs / name, config=cfg)
        for step in (4, 8):
            log.log(step, "loss", 1 / step)
            cells = [(l, d) for l in range(3) for d in (4, 8, 16)]
            for l, d in cells[:3] if (name, step) == ("mrl_s2", 8) else cells:
                log.log(step, f"stsb_dev/L{l}/d{d}/spearman", 50 + step + 4 * l + d / 4 + shift, split="eval")
        log.close()
    return runs


def test_browser_shows_html_in_names_as_text_and_refuses_other_host_names(tmp_path):
    "Run names, a config's method and a metric name holding HTML are text in the Monitor and Compare tabs (no injected script runs); a page under another name resolved to 127.0.0.1 (DNS rebinding) gets no workbench."
    browser_or_skip()
    runs = tmp_path / "runs"
    names = ["plain", 'x"><script>window.__pwned_s=1</script>', "x<img src=x onerror=window.__pwned_n=1>"]
    for i, name in enumerate(names):
        write_run(runs / name, config={"dims": [2, 4, 8], "method": f"<img src=x onerror=window.__pwned_m{i}=1>"})
    log = RunLog(runs / "plain")
    log.log(6, "<img src=x onerror=window.__pwned_metric=1>", 1.0)
    log.close()
    port = free_port()
    with serve(runs, port), chromium_page(1500, 1100, ["--host-resolver-rules=MAP evil.test 127.0.0.1"]) as page:
        page.goto(f"http://127.0.0.1:{port}/dashboards?run=plain", timeout=60_000)
        wait_shown(page.locator(".ml-step"), "step 6", seconds=60)
        page.get_by_text("Compare", exact=True).first.click()
        pattern = page.get_by_placeholder("the eval grid at the last layer")
        pattern.fill("*")
        pattern.press("Enter")
        wait_shown(page.locator(".ml-status").first, "")             # (a tick, then the table)
        deadline = time.time() + 20
        while "window.__pwned_metric=1" not in page.locator("table").first.inner_text() and time.time() < deadline:
            time.sleep(0.3)
        table = page.locator("table").first.inner_text()
        assert "train: <img src=x onerror=window.__pwned_metric=1>" in table and names[1] in table, table[:2000]
        chosen = page.locator(".choices__list--multiple .choices__item >> visible=true").all_inner_texts()
        assert [c.replace("Remove item", "").strip() for c in chosen] == names[:2], chosen
        page.screenshot(path=str(ARTIFACTS / "html_names_as_text.png"), full_page=True)
        assert page.evaluate("Object.keys(window).filter(k => k.startsWith('__pwned'))") == []
        page.goto(f"http://evil.test:{port}/dashboards?run=plain", timeout=60_000)
        page.get_by_text("Refused").first.wait_for(timeout=30_000)
        assert page.locator(".ml-step").count() == 0 and "plain" not in page.content()


def test_browser_compare_draws_the_prefix_overlay_and_the_difference(tmp_path):
    "The served Compare tab, opened on run base: the open run and the first other evaluated run are compared by default; with the three MRL seeds added they are one line with its band, the difference heatmap is drawn, both at step 4 (MRL's third seed has no complete step 8), and an SVG export is a figure of the size typed."
    browser_or_skip()
    runs = seed_runs(tmp_path / "runs")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with serve(runs, port), chromium_page(1500, 1300) as page:
        page.goto(f"http://127.0.0.1:{port}/dashboards?run=base", timeout=60_000)
        page.locator(".ml-step").wait_for(timeout=60_000)
        page.get_by_text("Compare", exact=True).first.click()
        note = page.locator(".ml-prefix-note")
        wait_shown(note, "Runs at step 8, the newest step all have evaluated completely")
        chosen = page.locator(".choices__list--multiple .choices__item >> visible=true").all_inner_texts()
        assert [c.replace("Remove item", "").strip() for c in chosen] == ["base", "mrl_s0"], chosen
        pick = page.locator("input.choices__input--cloned >> visible=true")
        for name in ("mrl_s1", "mrl_s2"):
            pick.click()
            page.locator(".choices__item--choice >> visible=true").filter(has_text=re.compile(f"^{name}$")).first.click()
            time.sleep(0.3)
        wait_shown(note, "Runs at step 4, the newest step all have evaluated completely")
        assert "mrl_s2 (step 8 is partial)" in shown(note), shown(note)
        page.get_by_text("Quality against prefix size", exact=True).first.click()   # Compare's second tab
        titles = {".ml-overlay": "stsb_dev: spearman, layer 2, step 4",
                  ".ml-difference": "stsb_dev: spearman, mrl_s0, step 4 − base, step 4"}
        for pane, title in titles.items():                          # Vega draws SVG: its text is on the page
            figure = page.locator(f"{pane} svg.marks").first
            wait_shown(figure, title)
            box = figure.bounding_box()
            assert box["width"] > 600 and box["height"] > 250, (pane, box)
        assert "mrl (3 seeds)" in shown(page.locator(".ml-overlay svg.marks").first)
        time.sleep(1.0)
        page.screenshot(path=str(ARTIFACTS / "compare_prefix_figures.png"), full_page=True)
        size = page.get_by_label("Export size, inches (w x h)")
        size.fill("3.5 x 2.5")
        size.press("Enter")
        with page.expect_download() as download:
            page.get_by_role("button", name="Export SVG").first.click()
        svg = Path(download.value.path()).read_text()
        assert re.match(r'<svg[^>]*width="3.5in" height="2.5in"', svg), svg[:300]
        assert "stsb_dev: spearman, layer 2, step 4" in svg and "mrl (3 seeds)" in svg


def notebook_with(folder: Path, name: str, source: str) -> Path:
    "folder/name, a notebook of one code cell."
    nb = {**NOTEBOOK, "cells": [{**NOTEBOOK["cells"][0], "source": source}]}
    (folder / name).write_text(json.dumps(nb))
    return folder / name


def run_first_cell(page, url: str, shows: str = ".ml-step", cell: int = 0) -> list:
    "Open the notebook at url in JupyterLab and run its first cell (or its cell number `cell`), accepting the dialogs a user would, until one more `shows` is on the page (other notebooks' tabs may hold some); the dialogs' titles."
    errors, asked = [], []
    page.on("pageerror", lambda e: errors.append(str(e)[:300]))
    page.goto(url, timeout=120_000)
    found, dialogs = page.locator(shows), page.locator(".jp-Dialog")
    page.locator(".jp-Notebook .jp-Cell >> visible=true").first.wait_for(timeout=120_000)
    before = found.count()

    def wait(seconds: float) -> bool:
        "Until the cell's output shows (True) or a dialog asks (False), at most `seconds`."
        end = time.time() + seconds
        while time.time() < end and found.count() <= before and not dialogs.count():
            time.sleep(0.25)
        return found.count() > before

    for attempt in range(4):                                 # a key press before the notebook is ready is lost
        page.locator(".jp-Notebook .jp-Cell >> visible=true").nth(cell).click(timeout=120_000)   # (other tabs: hidden)
        page.keyboard.press("Shift+Enter")                   # runs once the kernel is up
        for _ in range(3):                                   # a dialog may come first; accepting it runs the cell
            if wait(40) or not dialogs.count():
                break
            dialog = dialogs.first                           # accepted as a user would (4.6 may ask to Select Kernel)
            asked.append(dialog.locator(".jp-Dialog-header").inner_text())
            dialog.locator(".jp-mod-accept").click()
            dialog.wait_for(state="detached", timeout=10_000)
        if found.count() > before:
            break
        page.screenshot(path=str(ARTIFACTS / f"notebook_attempt{attempt}.png"), full_page=True)
    assert found.count() > before, f"{shows} never showed in the notebook; dialogs {asked}, page errors: {errors}"
    return asked


def test_notebook_shows_new_step_within_2s(tmp_path):
    "JupyterLab in headless Chromium runs show() in a notebook (no internet needed); a step written by another process shows within 2 s."
    browser_or_skip()
    runs = live_runs(tmp_path)
    notebook_with(tmp_path, "workbench.ipynb", NOTEBOOK["cells"][0]["source"].format(root=str(runs)))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with jupyter_lab(tmp_path, port), chromium_page() as page:
        asked = run_first_cell(page, f"http://127.0.0.1:{port}/lab/tree/workbench.ipynb?token=t")
        step = page.locator(".ml-step")
        wait_shown(step, "step 5")
        seen = seconds_to_show(step, runs / "live", 42)
        time.sleep(1.2)
        page.screenshot(path=str(ARTIFACTS / "notebook.png"), full_page=True)
        print(f"new step shown in the notebook {seen:.3f} s after the write; dialogs accepted: {asked}")


LATE_WRITER = """
import sys, time
from matryoshka_lab.runs import RunLog
log = RunLog(sys.argv[1], config={"dims": [2, 4, 8], "eval_tasks": ["stsb_dev"]})
log.log(1, "loss", 1.0)
log.log_many(1, {"diag/erank/L2/d4": 3.0, "diag/cka_prefix/L2/d4": 0.5}, split="eval")   # a probe's diagnostics first
time.sleep(float(sys.argv[2]))
log.log(2, "stsb_dev/L2/d4/spearman", 61.0, split="eval")                              # then the task's metric
log.close()
"""


def test_notebook_awaits_a_run_and_its_task_metric(tmp_path):
    "show(root, name) in JupyterLab before the run exists: the page says it waits, opens the run once it starts, and the eval picker moves from the diagnostics to the task's metric when it is logged."
    browser_or_skip()
    runs = tmp_path / "runs"
    (runs / "other").mkdir(parents=True)
    RunLog(runs / "other", config={"dims": [2, 4, 8]}).close()
    notebook_with(tmp_path, "late.ipynb", f"from matryoshka_lab.workbench import show\nshow({str(runs)!r}, 'late')")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with jupyter_lab(tmp_path, port), chromium_page() as page:
        run_first_cell(page, f"http://127.0.0.1:{port}/lab/tree/late.ipynb?token=t")
        page.get_by_text("waiting for run").first.wait_for(timeout=20_000)
        writer = subprocess.Popen([sys.executable, "-c", LATE_WRITER, str(runs / "late"), "6"], cwd=ROOT)
        chosen = lambda name: page.locator(".choices__list--multiple .choices__item", has_text=name)   # a picker's chosen
        try:
            wait_shown(page.locator(".ml-step"), "step 1", seconds=30)                    # opened once it started
            chosen("diag/cka_prefix/L2/d4").first.wait_for(timeout=20_000)                # nothing better yet
            chosen("stsb_dev/L2/d4/spearman").first.wait_for(timeout=30_000)              # the task's metric, when logged
            wait_shown(page.locator(".ml-step"), "step 2", seconds=30)
            page.screenshot(path=str(ARTIFACTS / "notebook_awaited.png"), full_page=True)
        finally:
            writer.wait(timeout=60)
        assert chosen("diag/cka_prefix/L2/d4").count() == 0                # the diagnostics left the eval picker


def answers(url: str) -> bool:
    "Whether a server answers at url."
    try:
        urllib.request.urlopen(url, timeout=10).close()
        return True
    except OSError:                                          # refused (URLError), reset, timed out
        return False


def test_notebook_cell_run_again_stops_the_workbench_it_showed(tmp_path):
    "show() in a JupyterLab cell run twice: the first run's server no longer answers and the second's does (one server and one poll per cell, however often it runs)."
    browser_or_skip()
    runs = live_runs(tmp_path)
    notebook_with(tmp_path, "again.ipynb", f"from matryoshka_lab.workbench import show\nshow({str(runs)!r}, 'live')")
    port = free_port()
    with jupyter_lab(tmp_path, port), chromium_page() as page:
        run_first_cell(page, f"http://127.0.0.1:{port}/lab/tree/again.ipynb?token=t")
        link = page.locator(".ml-served a")
        first = link.first.get_attribute("href")
        wait_shown(page.locator(".ml-step").last, "step 5")
        page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor >> visible=true").first.click()   # its code, not the app
        page.keyboard.press("Control+Enter")                  # the same cell again
        deadline = time.time() + 60
        while time.time() < deadline and (not link.count() or link.first.get_attribute("href") == first):
            time.sleep(0.25)
        second = link.first.get_attribute("href")
        wait_shown(page.locator(".ml-step").last, "step 5")
        assert second != first and answers(second), (first, second)
        assert not answers(first), f"the first run's server at {first} still answers"


BUSY = "import time\nt = time.time()\nwhile time.time() - t < {seconds}:    # pure Python: the GIL is held as a long cell holds it\n    sum(range(1000))"


def refused_websocket(url: str, origin: str) -> int:
    "Open the Bokeh websocket of the server at url from a page of `origin` (which it does not serve): the HTTP status of the refusal."
    import asyncio
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect
    async def attempt():
        try:
            await websocket_connect(HTTPRequest(url.replace("http", "ws", 1) + "/ws", headers={"Origin": origin}))
        except HTTPClientError as err:
            return err.code
        return 101
    with concurrent.futures.ThreadPoolExecutor(1) as pool:          # (Playwright's loop runs in this thread)
        return pool.submit(asyncio.run, attempt()).result(timeout=60)


def test_notebook_page_stays_live_while_another_cell_runs(tmp_path):
    "show() in JupyterLab, then a cell that keeps the kernel busy for 60 s: steps another process writes meanwhile show within 2 s; a refused websocket's log line goes to the server log, not into the saved notebook."
    browser_or_skip()
    runs = live_runs(tmp_path)
    path = tmp_path / "busy.ipynb"
    cells = [{**NOTEBOOK["cells"][0], "source": NOTEBOOK["cells"][0]["source"].format(root=str(runs))},
             {**NOTEBOOK["cells"][0], "id": "c1", "source": BUSY.format(seconds=60)}]
    path.write_text(json.dumps({**NOTEBOOK, "cells": cells}))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with jupyter_lab(tmp_path, port), chromium_page(1400, 2200) as page:      # tall: the app and the busy cell in one shot
        run_first_cell(page, f"http://127.0.0.1:{port}/lab/tree/busy.ipynb?token=t")
        step = page.locator(".ml-step").last
        wait_shown(step, "step 5")
        url = page.locator(".ml-served a").first.get_attribute("href")
        page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor >> visible=true").nth(1).click()
        page.keyboard.press("Shift+Enter")
        prompt = page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt >> visible=true").nth(1)
        deadline = time.time() + 20
        while "*" not in prompt.inner_text() and time.time() < deadline:
            time.sleep(0.1)
        assert "*" in prompt.inner_text(), prompt.inner_text()           # the busy cell runs
        started, seen = time.time(), []
        for n in (50, 51, 52):
            seen.append(seconds_to_show(step, runs / "live", n))
            time.sleep(8)
        origin = f"http://elsewhere-{port}.invalid"
        assert refused_websocket(url, origin) == 403
        assert "*" in prompt.inner_text() and time.time() - started < 60   # all of it while the cell still ran
        page.screenshot(path=str(ARTIFACTS / "notebook_busy_kernel.png"), full_page=True)
        deadline = time.time() + 90
        while "*" in prompt.inner_text() and time.time() < deadline:
            time.sleep(0.5)
        page.locator(".jp-Notebook .jp-Cell >> visible=true").first.click()
        page.keyboard.press("Control+s")
        _, text = saved_outputs(path)
    log = Path(tempfile.gettempdir()) / "matryoshka_lab_workbench.log"
    assert origin in log.read_text(errors="replace"), "the refusal was not logged to the server log"
    saved = json.loads(path.read_text())
    assert origin not in json.dumps(saved) and "Refusing" not in json.dumps(saved), text[:2000]
    print(f"steps shown {', '.join(f'{s:.2f}' for s in seen)} s after they were written, the kernel busy")


FIGURES_NOTEBOOK = [
    "import pandas as pd\nfrom matryoshka_lab.explorer import Explorer\n"
    "angle = pd.read_csv({summary!r})\nfour = angle[angle.method.isin(['base', 'mrl', '2dmse', 'ese'])]\n"
    "ex = Explorer(four, by='method')\nex",
    "from matryoshka_lab.figures import difference_chart, prefix_chart\n"
    "mean = lambda m: four[four.method == m].groupby(['task', 'layer', 'dim', 'metric'], as_index=False).value.mean()\n"
    "display(prefix_chart(four, 'stsb', 'spearman', by='method'))\n"
    "display(prefix_chart(four[four.method == '2dmse'], 'stsb', 'spearman', layer='each', by='method'))\n"
    "difference_chart(mean('mrl'), mean('base'), 'stsb', 'spearman', ('mrl', 'base'))"]


def test_notebook_explorer_and_figures_show_offline_and_save_small(tmp_path):
    "JupyterLab runs the explorer and three altair figures (no network): JupyterLab draws them, a changed widget redraws the explorer's figure, the saved notebook is under 1 MB, and nbconvert's HTML of it shows all four figures in Chromium."
    browser_or_skip()
    path = tmp_path / "figures.ipynb"
    summary = str(ROOT / "results" / "baselines" / "angle" / "summary.csv")
    cells = [{**NOTEBOOK["cells"][0], "id": f"f{i}", "source": src.format(summary=summary)} for i, src in enumerate(FIGURES_NOTEBOOK)]
    path.write_text(json.dumps({**NOTEBOOK, "cells": cells}))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with jupyter_lab(tmp_path, port), chromium_page(1400, 2400) as page:
        run_first_cell(page, f"http://127.0.0.1:{port}/lab/tree/figures.ipynb?token=t", shows=".widget-dropdown")
        page.locator(".jp-Notebook .jp-Cell .jp-InputArea-editor >> visible=true").nth(1).click()
        page.keyboard.press("Shift+Enter")
        drawn = page.locator(".jp-OutputArea-output .vega-embed")
        deadline = time.time() + 60
        while drawn.count() < 4 and time.time() < deadline:
            time.sleep(0.25)
        assert drawn.count() == 4, f"JupyterLab drew {drawn.count()} of 4 figures"
        dropdowns = page.locator(".widget-dropdown select")             # figure, task, metric, precision, layer, ...
        dropdowns.nth(1).select_option(label="stsb")
        time.sleep(1)
        dropdowns.nth(4).select_option(label="3")
        time.sleep(2)
        page.screenshot(path=str(ARTIFACTS / "notebook_explorer_figures.png"), full_page=True)
        page.locator(".jp-Notebook .jp-Cell >> visible=true").first.click()
        page.keyboard.press("Control+s")
        deadline = time.time() + 30
        while time.time() < deadline and "layer 3" not in path.read_text():
            time.sleep(0.5)
    saved = json.loads(path.read_text())
    outputs = [o for c in saved["cells"] for o in c["outputs"]]
    titles = [o["data"]["application/vnd.vegalite.v5+json"]["title"]["text"] for o in outputs
              if "application/vnd.vegalite.v5+json" in o.get("data", {})]
    assert titles == ["stsb: spearman, layer 3", "stsb: spearman, layer 6", "stsb: spearman, every layer",
                      "stsb: spearman, mrl − base"], titles          # the explorer's figure is the one drawn last
    assert all("image/svg+xml" in o["data"] for o in outputs if "application/vnd.vegalite.v5+json" in o.get("data", {}))
    size = path.stat().st_size
    assert size < 1_000_000, size
    res = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(path)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    with chromium_page(1400, 2400) as page:
        page.goto(path.with_suffix(".html").as_uri())
        figures = page.locator(".jp-RenderedSVG img")                   # nbconvert shows the SVG copies as images
        assert figures.count() == 4, figures.count()
        assert all(figures.nth(i).evaluate("e => e.complete && e.naturalWidth > 100") for i in range(4))
        first = figures.first.get_attribute("src")
        assert "stsb: spearman, layer 3" in (base64.b64decode(first.split(",", 1)[1]).decode() if ";base64," in first
                                             else urllib.parse.unquote(first))
        page.screenshot(path=str(ARTIFACTS / "nbconvert_figures.png"), full_page=True)
    print(f"saved notebook with the explorer and three figures: {size / 1e3:.0f} KB")


def saved_outputs(path: Path, seconds: float = 30) -> tuple[int, str]:
    "(size in bytes, outputs' text) of the notebook at path once JupyterLab saved it with its outputs."
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            cells = json.loads(path.read_text())["cells"]
        except ValueError:                                   # caught mid-write
            cells = [{}]
        if cells[0].get("outputs"):
            return path.stat().st_size, json.dumps(cells[0]["outputs"])
        time.sleep(0.5)
    raise AssertionError(f"{path.name} was not saved with its outputs within {seconds} s")


def test_saved_notebook_stays_small_and_says_it_needs_a_kernel(tmp_path):
    "show() in JupyterLab, the notebook saved (Ctrl+S): under 500 KB and saying the live view needs its kernel; Panel's inline output (show(served=False)) for the size before."
    browser_or_skip()
    runs = live_runs(tmp_path)
    code = "from matryoshka_lab.workbench import show\nshow({root!r}, 'live'{extra})"
    served = notebook_with(tmp_path, "served.ipynb", code.format(root=str(runs), extra=""))
    inline = notebook_with(tmp_path, "inline.ipynb", code.format(root=str(runs), extra=", served=False"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    sizes = {}
    with jupyter_lab(tmp_path, port), chromium_page() as page:
        for path in (served, inline):            # (the newest notebook's output is last; the 16 MB one opened last)
            run_first_cell(page, f"http://127.0.0.1:{port}/lab/workspaces/{path.stem}/tree/{path.name}?token=t")  # alone
            wait_shown(page.locator(".ml-step").last, "step 5" if path == served else "step 43")
            if path == served:
                seconds_to_show(page.locator(".ml-step").last, runs / "live", 43)   # served from the kernel: live
                page.screenshot(path=str(ARTIFACTS / "notebook_served.png"), full_page=True)
            page.locator(".jp-Notebook .jp-Cell >> visible=true").first.click()   # the notebook focused, not the app
            page.keyboard.press("Control+s")
            page.screenshot(path=str(ARTIFACTS / f"saved_{path.stem}.png"), full_page=True)
            sizes[path.name], text = saved_outputs(path)
            if path == served:
                assert "needs that kernel" in text and "autoload.js" in text, text[:2000]
    print(f"saved notebook after show(): {sizes['served.ipynb'] / 1e3:.1f} KB served from the kernel, "
          f"{sizes['inline.ipynb'] / 1e6:.1f} MB with Panel's inline output")
    assert sizes["served.ipynb"] < 500_000 < sizes["inline.ipynb"]


def test_a_notebook_opened_without_its_kernel_shows_the_figures_as_they_last_were(tmp_path):
    "show() in JupyterLab keeps a static copy of its figures above the live app, made again while the run goes on; saved, converted by nbconvert (no kernel) and opened in Chromium, it shows the newest step's figures."
    browser_or_skip()
    runs = live_runs(tmp_path)
    path = notebook_with(tmp_path, "copy.ipynb", f"from matryoshka_lab.workbench import show\nshow({str(runs)!r}, 'live', static_every_s=1)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with jupyter_lab(tmp_path, port), chromium_page() as page:
        run_first_cell(page, f"http://127.0.0.1:{port}/lab/tree/copy.ipynb?token=t")
        step = page.locator(".ml-step").last
        wait_shown(step, "step 5")
        summary = page.locator("details.ml-static summary").first
        assert "as of step 5" in summary.inner_text(), summary.inner_text()
        seconds_to_show(step, runs / "live", 44)
        deadline = time.time() + 30                      # a slow tick (5 s) after the step, the copy is made again
        while "as of step 44" not in summary.inner_text() and time.time() < deadline:
            time.sleep(0.5)
        assert "as of step 44" in summary.inner_text(), summary.inner_text()
        page.locator(".jp-Notebook .jp-Cell >> visible=true").first.click()
        page.keyboard.press("Control+s")
        size, text = saved_outputs(path)
    assert "as of step 44" in text and "needs that kernel" in text and size < 500_000, (size, text[:500])
    res = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(path)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    with chromium_page() as page:
        page.goto(path.with_suffix(".html").as_uri())
        page.locator("details.ml-static summary").first.click()
        images = page.locator("details.ml-static img")
        assert images.count() == 3 and all(images.nth(i).evaluate("e => e.complete && e.naturalWidth > 200") for i in range(3))
        page.screenshot(path=str(ARTIFACTS / "notebook_without_kernel.png"), full_page=True)


def test_the_tutorials_first_cells_run_again_in_jupyterlab(tmp_path):
    "nbs/25_your_method.ipynb in JupyterLab with a kernel: its first code cells run, run again as a reader re-runs them, and the check after them prints the loss's pairs (the first cell once deleted the kernel's working directory: every later cell failed with FileNotFoundError)."
    browser_or_skip()
    nb = json.loads((ROOT / "nbs" / "25_your_method.ipynb").read_text(encoding="utf-8"))
    for c in nb["cells"]:                                                       # as a reader's own copy: no outputs
        if c["cell_type"] == "code":
            c.update(outputs=[], execution_count=None)
    (tmp_path / "your_method.ipynb").write_text(json.dumps(nb))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with jupyter_lab(tmp_path, port), chromium_page() as page:
        outputs = page.locator(".jp-OutputArea-output")
        run_first_cell(page, f"http://127.0.0.1:{port}/lab/tree/your_method.ipynb?token=t",
                       shows=".jp-InputPrompt >> text=[1]", cell=2)            # the first code cell: no output
        page.keyboard.press("Shift+Enter")                                      # %%writefile my_methods/diagonal.py
        outputs.filter(has_text="Writing my_methods").first.wait_for(timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell").nth(2).click()                    # both again, then the check
        for _ in range(4):                                                      # (its markdown cell between)
            page.keyboard.press("Shift+Enter")
        outputs.filter(has_text="Overwriting my_methods").first.wait_for(timeout=60_000)
        outputs.filter(has_text="((6, 384), (5, 64), (4, 16))").first.wait_for(timeout=120_000)
        page.screenshot(path=str(ARTIFACTS / "tutorial_rerun.png"), full_page=True)
        errors = outputs.filter(has_text="Error").all_inner_texts()
    assert not errors, errors[0][:2000]
    assert (tmp_path / "your_method.ipynb").is_file()                           # the kernel's folder is still there


RESULT_NOTEBOOK = "studies/06_report.ipynb"     # committed with its outputs (experiments/notebooks.py)


def test_results_notebook_shows_outputs_unexecuted(tmp_path):
    "JupyterLab opens a committed results notebook and, without running a cell, shows its tables and figures."
    browser_or_skip()
    nb = json.loads((ROOT / "nbs" / RESULT_NOTEBOOK).read_text(encoding="utf-8"))
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    images = sum("image/png" in o.get("data", {}) for o in outputs)
    tables = sum("".join(o.get("data", {}).get("text/markdown", "")).startswith("|") for o in outputs)
    assert images >= 3 and tables >= 10, f"{RESULT_NOTEBOOK} has {images} figures and {tables} tables: run experiments/notebooks.py"
    (tmp_path / RESULT_NOTEBOOK).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbs" / RESULT_NOTEBOOK, tmp_path / RESULT_NOTEBOOK)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with jupyter_lab(tmp_path, port), chromium_page(1500, 1100) as page:
        page.goto(f"http://127.0.0.1:{port}/lab/tree/{RESULT_NOTEBOOK}?token=t", timeout=120_000)
        page.locator(".jp-OutputArea-output img").first.wait_for(timeout=120_000)
        shown_images = page.locator(".jp-OutputArea-output img").count()
        shown_tables = page.locator(".jp-OutputArea-output table").count()
        figure = page.locator(".jp-OutputArea-output img").first
        figure.scroll_into_view_if_needed()
        page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=figure.element_handle(), timeout=30_000)
        time.sleep(1.5)                                          # the cells scrolled into view finish drawing
        page.screenshot(path=str(ARTIFACTS / "results_notebook.png"), full_page=False)
    # JupyterLab renders cells lazily (windowing): what is on screen shows, the rest as it scrolls in
    assert shown_images >= 1 and shown_tables >= 1, (shown_images, shown_tables)


def tutorial_module(folder: Path) -> str:
    "The tutorial's own method module (nbs/25_your_method.ipynb, its %%writefile cell) written into folder/my_methods."
    nb = json.loads((ROOT / "nbs" / "25_your_method.ipynb").read_text(encoding="utf-8"))
    cell = next("".join(c["source"]) for c in nb["cells"] if "".join(c["source"]).startswith("%%writefile"))
    (folder / "my_methods").mkdir(parents=True)
    (folder / "my_methods" / "__init__.py").write_text("")
    (folder / "my_methods" / "diagonal.py").write_text(cell.split("\n", 1)[1])
    return "my_methods.diagonal:Diagonal"


def compare_in_page(page, runs, pattern):
    "In the Compare tab: clear the default choice, choose `runs` by clicking (the first is the reference), set the pattern; wait for the last run's delta column."
    page.get_by_text("Compare", exact=True).first.click()
    pick = page.locator("input.choices__input--cloned >> visible=true")
    pick.wait_for(timeout=20_000)
    note, deadline = page.locator(".ml-prefix-note"), time.time() + 30   # the default runs have come (the open run
    while not any(t in shown(note) for t in ("Runs at", "No layer x dim", "Choose runs")) and time.time() < deadline:
        time.sleep(0.2)                                                 # and another): cleared only once they are there
    while page.locator("button.choices__button >> visible=true").count():
        page.locator("button.choices__button >> visible=true").first.click()
        time.sleep(0.3)
    for name in runs:
        pick.click()
        page.locator(".choices__item--choice >> visible=true").filter(has_text=re.compile(f"^{name}$")).first.click()
        time.sleep(0.3)
    box = page.get_by_placeholder("the eval grid at the last layer")   # the metric pattern
    box.fill(pattern)
    box.press("Enter")
    page.get_by_text(f"Δ {runs[-1]}").first.wait_for(timeout=20_000)


def test_browser_compares_a_method_of_your_own(tmp_path, tiny_model_dir, monkeypatch):
    "The tutorial's method, trained next to MRL and 2DMSE (a tiny model, 2 steps), in the compare tab: chosen by clicking, its grid values shown."
    browser_or_skip()
    from matryoshka_lab.config import make_config
    from matryoshka_lab.trainer import Trainer
    monkeypatch.syspath_prepend(str(tmp_path))
    method = tutorial_module(tmp_path)
    runs, common = tmp_path / "runs", {"model": str(tiny_model_dir), "objective": "angle", "train_task": "builtin_sts",
                                       "max_steps": 2, "batch_size": 8, "max_length": 32, "dims": [8, 16, 32],
                                       "eval_tasks": ["builtin_sts"], "eval_every": 0, "checkpoint_every": 0}
    for name, m in [("mrl", "mrl"), ("2dmse", "2dmse"), ("diagonal", method)]:
        Trainer(make_config({**common, "method": m, "run_dir": str(runs / name)}), progress=False).fit()
    grid = {name: pd.read_csv(runs / name / "grid.csv").set_index(["layer", "dim"]).value for name in ("mrl", "diagonal")}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with serve(runs, port), chromium_page(1500, 1100) as page:
        page.goto(f"http://127.0.0.1:{port}/dashboards", timeout=60_000)
        page.locator(".ml-step").wait_for(timeout=60_000)
        compare_in_page(page, ("mrl", "2dmse", "diagonal"), "builtin_sts/*")   # MRL first: the reference of the deltas
        time.sleep(1.5)
        head = page.locator("tr:has-text('Δ diagonal')").first.inner_text().split("\t")
        row = page.locator("tr:has-text('builtin_sts/L1/d8/spearman')").first.inner_text().split("\t")
        page.screenshot(path=str(ARTIFACTS / "compare_your_method.png"), full_page=False)
    assert [h.strip() for h in head[1:]] == ["as of step", "mrl", "2dmse", "diagonal", "Δ 2dmse", "Δ diagonal"], head
    mrl, diagonal = grid["mrl"][(1, 8)], grid["diagonal"][(1, 8)]
    assert (row[1], row[2], row[4], row[6]) == ("2", f"{mrl:.4g}", f"{diagonal:.4g}", f"{diagonal - mrl:.4g}"), row   # the final evaluation, at step 2


ST_WRITER = """
import sys, time, warnings
warnings.filterwarnings("ignore")
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.losses import MatryoshkaLoss, MultipleNegativesRankingLoss
from transformers import TrainerCallback
from matryoshka_lab.watch import RunDirectoryCallback
model_dir, run_dir, out_dir, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

class Slow(TrainerCallback):   # a tiny model trains in milliseconds: a step of a real one takes longer
    def on_step_end(self, *args, **kwargs):
        time.sleep(0.1)

model = SentenceTransformer(model_dir, device="cpu")
pairs = Dataset.from_dict({"anchor": [f"sentence number {i} about topic {i % 5}" for i in range(64)],
                           "positive": [f"the {i}th sentence, on topic {i % 5}" for i in range(64)]})
args = SentenceTransformerTrainingArguments(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=8, logging_steps=1,
                                            eval_strategy="steps", eval_steps=10, save_strategy="no", report_to=[],
                                            use_cpu=True, disable_tqdm=True)
trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=pairs, eval_dataset=pairs.select(range(8)),
                                     loss=MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), [32, 16, 8]),
                                     callbacks=[RunDirectoryCallback(run_dir, tasks=["builtin_sts"], dims=[8, 16, 32]), Slow()])
trainer.train()
"""


def test_browser_follows_a_sentence_transformers_run(tmp_path, tiny_model_dir):
    "A sentence-transformers run in another process writes through RunDirectoryCallback; the open workbench shows its new steps and grids while it trains, and compares it with a run of our trainer."
    browser_or_skip()
    from matryoshka_lab.config import make_config
    from matryoshka_lab.trainer import Trainer
    runs = tmp_path / "runs"
    Trainer(make_config({"model": str(tiny_model_dir), "method": "mrl", "objective": "infonce", "train_task": "builtin_sts",
                         "max_steps": 2, "batch_size": 8, "max_length": 32, "dims": [8, 16, 32], "eval_tasks": ["builtin_sts"],
                         "eval_every": 0, "checkpoint_every": 0, "run_dir": str(runs / "ours")}), progress=False).fit()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(tmp_path / "st.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", ST_WRITER, str(tiny_model_dir), str(runs / "st"), str(tmp_path / "out"), "300"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    port = free_port()
    try:
        with serve(runs, port), chromium_page(1500, 1100) as page:
            page.goto(f"http://127.0.0.1:{port}/dashboards", timeout=60_000)
            step = page.locator(".ml-step")
            step.wait_for(timeout=60_000)
            deadline = time.time() + 120
            while "st" not in page.locator("select").first.evaluate("s => [...s.options].map(o => o.value)") and time.time() < deadline:
                time.sleep(0.5)                                   # the run appears in the picker once it has written
            page.locator("select").first.select_option("st")
            seen = []                                             # (step shown, grid title's step) while it trains
            while proc.poll() is None and len(seen) < 40 and time.time() < deadline:
                text = shown(step)
                titles = " ".join(page.locator(".role-title").all_text_contents())  # Vega's titles; the Snapshots tab's has a step too
                grid = re.findall(r"evaluated at step (\d+)", titles)
                if (m := re.search(r"step (\d+)", text)):
                    seen.append((int(m.group(1)), int(grid[-1]) if grid else None))
                time.sleep(0.5)
            assert proc.poll() is None, "the run ended before the page could follow it: " + (tmp_path / "st.log").read_text()[-2000:]
            page.screenshot(path=str(ARTIFACTS / "st_run.png"), full_page=False)
            steps = [s for s, _ in seen]
            grids = sorted({g for _, g in seen[1:] if g is not None})   # seen[0] may be the run shown before "st"
            assert steps[-1] > steps[0] > 0, seen                 # new steps appeared while it trained
            assert len(grids) >= 2, seen                          # and new grids (the trainer evaluates every 10 steps)
            compare_in_page(page, ("ours", "st"), "builtin_sts/L3/*")
            step_box = page.get_by_role("textbox", name="As of step")   # ours ended at step 2,
            step_box.fill("1000000")                                  # st evaluates from step 10: their final values
            step_box.press("Enter")
            page.get_by_text("as of step 1000000").first.wait_for(timeout=20_000)
            row = page.locator("tr:has-text('builtin_sts/L3/d8/spearman')").first.inner_text().split("\t")
            page.screenshot(path=str(ARTIFACTS / "compare_st_run.png"), full_page=False)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    ours = pd.read_csv(runs / "ours" / "grid.csv").set_index(["layer", "dim"]).value[(3, 8)]
    assert row[2] == f"{ours:.4g}" and row[3].strip() not in ("", "nan", "–"), row
