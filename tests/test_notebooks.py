"""The notebooks are the source: each runs top to bottom (nbdev_test), exporting them changes nothing, and the results
notebooks' committed outputs are what they print."""
import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, shared_data_dir

NOTEBOOKS = sorted(p.relative_to(ROOT / "nbs").as_posix() for p in (ROOT / "nbs").rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)   # the library's, then studies/
sys.path.insert(0, str(ROOT / "experiments"))
from notebooks import RESULT_NOTEBOOKS, same_outputs      # noqa: E402


def run_whole_by_the_check(nb: str) -> bool:
    "A results notebook that never reads IN_TEST runs the same cells under nbdev_test as under the outputs check, which executes it when there is a data directory."
    return (shared_data_dir() is not None and nb in RESULT_NOTEBOOKS
            and "IN_TEST" not in (ROOT / "nbs" / nb).read_text(encoding="utf-8"))


@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_notebook_runs(nb):
    if run_whole_by_the_check(nb):
        pytest.skip("executed whole, its outputs compared, by test_results_notebooks_outputs_reproduce")
    env = dict(os.environ)
    data = shared_data_dir()
    if data is not None:
        env.setdefault("MATRYOSHKA_LAB_DATA", str(data))
    res = subprocess.run(["nbdev_test", "--path", f"nbs/{nb}", "--do_print"], cwd=ROOT, capture_output=True,
                         text=True, timeout=900, env=env)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]


def _diff(a: Path, b: Path) -> list[str]:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    out = [f"only in one: {x}" for x in cmp.left_only + cmp.right_only] + [f"differs: {x}" for x in cmp.diff_files]
    for sub in cmp.common_dirs:
        out += _diff(a / sub, b / sub)
    return out


def test_library_matches_notebooks(tmp_path):
    for item in ("settings.ini", "nbs", "matryoshka_lab"):
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / item)
    res = subprocess.run(["nbdev_export"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert _diff(ROOT / "matryoshka_lab", tmp_path / "matryoshka_lab") == [], \
        "matryoshka_lab/ differs from what nbdev_export writes: edit the notebooks, run nbdev_export, commit both"


def test_results_notebooks_outputs_reproduce():
    "The results notebooks are committed with outputs, and re-executing them on the committed result files changes none."
    data = shared_data_dir()
    if data is None:
        pytest.skip("the committed outputs are those of the real data: set MATRYOSHKA_LAB_DATA")
    for name in RESULT_NOTEBOOKS:
        nb = json.loads((ROOT / "nbs" / name).read_text(encoding="utf-8"))
        assert any(c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), \
            f"nbs/{name} has no outputs: run `python experiments/notebooks.py`"
    res = subprocess.run([sys.executable, "experiments/notebooks.py", "--check", "--data", str(data)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    print(res.stdout)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]


def test_outputs_compare_up_to_float_noise():
    "The --check's comparison lets a number move by its last printed digit or RTOL, and nothing more."
    spec = lambda v, name: {"datasets": {name: [{"dim": 16, "value": v}]}, "data": {"name": name}}   # a Vega-Lite output
    a, b = "data-" + "0" * 32, "data-" + "f" * 32                       # altair names a chart's data by its hash
    assert same_outputs([{"text": "loss 203.676, acc 0.110"}], [{"text": "loss 203.677, acc 0.111"}])
    assert not same_outputs([{"text": "loss 203.676"}], [{"text": "loss 203.776"}])
    assert not same_outputs([{"text": "loss 203.676"}], [{"text": "loss 203.676 nan"}])
    assert same_outputs(spec(76.443154, a), spec(76.439097, b))
    assert not same_outputs(spec(76.443154, a), spec(76.3, b))
    assert not same_outputs(spec(76.443154, a), {**spec(76.443154, a), "title": "another"})


def test_the_tutorials_first_cells_run_again(tmp_path, monkeypatch):
    "nbs/25_your_method.ipynb's first cells run a second time, as a reader re-runs them, and the check after them still runs in a kernel (in-process IPython): the first cell once deleted the kernel's working directory."
    from IPython.core.interactiveshell import InteractiveShell
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    nb = json.loads((ROOT / "nbs" / "25_your_method.ipynb").read_text(encoding="utf-8"))
    cells = {c["id"]: "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"}
    shell = InteractiveShell.instance()
    for cid in ("22c002", "22c003", "22c002", "22c003", "22c005"):
        result = shell.run_cell(cells[cid])
        assert result.success, (cid, result.error_before_exec or result.error_in_exec)
    assert Path.cwd() == tmp_path and tmp_path.is_dir()
