"""The first dashboard: builds from a runs root, ignores what it must, and serves on localhost."""
import importlib.util
import os
import socket
import subprocess
import time
import urllib.request

import pandas as pd

from conftest import ROOT


def load_dashboard():
    spec = importlib.util.spec_from_file_location("dash_main", ROOT / "dashboards" / "main.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_grid(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [("stsb", l, d, "spearman", 50.0 + l + d / 100) for l in range(3) for d in (16, 32)]
    pd.DataFrame(rows, columns=["task", "layer", "dim", "metric", "value"]).to_csv(path, index=False)


def test_finds_grids_and_refuses_escapes(tmp_path):
    dash = load_dashboard()
    root = tmp_path / "runs"
    write_grid(root / "demo" / "grid.csv")
    write_grid(tmp_path / "outside" / "grid.csv")
    (root / "sneaky").mkdir()
    (root / "sneaky" / "grid.csv").symlink_to(tmp_path / "outside" / "grid.csv")
    assert list(dash.find_grids(root.resolve())) == ["demo/grid.csv"]
    app = dash.build_app(root.resolve())
    assert "layer x dim" in app[0].object


def test_bad_files_do_not_crash(tmp_path):
    dash = load_dashboard()
    bad = tmp_path / "grid.csv"
    bad.write_text("task,layer,dim,metric,value\nstsb,0,16,spearman,5")   # half-written last line
    assert len(dash.read_grid(bad)) == 1
    bad.write_text("not,a,grid\n1,2,3\n")
    assert dash.read_grid(bad).empty
    assert dash.read_grid(tmp_path / "missing.csv").empty
    empty_root = tmp_path / "none"
    assert "No `grid.csv`" in dash.build_app(empty_root)[1].object


def test_panel_serve_answers_on_localhost(tmp_path):
    write_grid(tmp_path / "runs" / "demo" / "grid.csv")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MATRYOSHKA_LAB_RUNS": str(tmp_path / "runs")}
    proc = subprocess.Popen(["panel", "serve", "dashboards/", "--address", "127.0.0.1", "--port", str(port),
                             "--allow-websocket-origin", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        body, deadline = None, time.time() + 60
        while time.time() < deadline and body is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.5)
        assert body is not None, proc.stderr.read1().decode()[-2000:] if proc.poll() is not None else "no answer"
        assert "matryoshka_lab" in body
    finally:
        proc.terminate()
        proc.wait(timeout=20)
