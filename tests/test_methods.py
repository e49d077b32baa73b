"""The library's structure: no import cycle, layers and notebook numbers that follow the imports, no study imported by the
library; the trainer knows methods only through the registry."""
import ast
import re
from pathlib import Path

from conftest import ROOT
from matryoshka_lab.methods import BUILTIN, get_method

LIB = ROOT / "matryoshka_lab"


def library_imports(path: Path) -> set[str]:
    "The library modules a module imports anywhere in it (top level or inside functions), relative or absolute."
    modules = {p.stem for p in LIB.glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
            elif node.module and node.module.split(".")[0] == "matryoshka_lab":
                parts = node.module.split(".")
                found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("matryoshka_lab."))
    return (found & modules) - {path.stem}


def test_import_graph_has_no_cycle():
    graph = {p.stem: library_imports(p) for p in LIB.glob("*.py")}
    state, cycles = {}, []
    def visit(module, path):
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [module, dep] if dep in path else [module, dep])
            elif dep not in state:
                visit(dep, path + [module])
        state[module] = "done"
    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert cycles == [], f"import cycles: {cycles}"
    assert graph["methods"] == set(), "methods.py must import no other library module (every method module imports it)"


LAYERS = {   # the README's picture, bottom up: a module imports only modules of its own layer or of those below
    "base": ("core", "methods", "encoder", "data", "runs"),
    "losses": ("losses",),
    "measuring": ("budget", "eval", "transforms", "adaptor", "sparse_codes", "references", "diagnostics", "stats", "plots", "figures"),
    "training": ("config", "distributed", "checkpoint", "recipe", "views", "batches", "data_used", "run_references", "trainer", "launch",
                 "gradients"),
    "papers": ("mipic", "mic", "distill", "fractal", "fractal_runner", "routing"),
    "apps": ("tutorial", "transform_export", "cli", "st_loss", "dashboard", "run_figures", "exports", "grid_tabs", "evaluations", "explorer", "compare", "notebook_copy", "serving", "workbench", "deploy", "watch")}


def test_each_layer_imports_only_its_own_and_those_below():
    rank = {m: i for i, modules in enumerate(LAYERS.values()) for m in modules}
    assert set(rank) == {p.stem for p in LIB.glob("*.py")} - {"__init__", "_modidx"}, "every library module has a layer"
    names = list(LAYERS)
    above = {m: sorted(d for d in library_imports(LIB / f"{m}.py") if rank[d] > r) for m, r in rank.items()}
    assert {m: d for m, d in above.items() if d} == {}, f"imports from a layer above: {above} ({names})"


def private_crossings(source: str, own: str = "") -> list[str]:
    """The `_names` a module (named `own`) takes from another library module: `from .x import _y`, or `x._y` on an imported
    module `x`. Its own `_names`, through an import of itself (as a worker process needs), are its business."""
    tree, crossings, modules = ast.parse(source), [], set()
    for node in ast.walk(tree):
        library = isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] == "matryoshka_lab")
        if library and (node.module or "").split(".")[-1] != own:
            crossings += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            modules.update(a.asname or a.name for a in node.names if a.name != own)   # `from . import x (as y)`: a module
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.asname and a.name.startswith("matryoshka_lab."))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                crossings.append(f"{node.value.id}.{node.attr}")
    return crossings


def test_no_library_module_uses_another_modules_private_names():
    "A helper two modules share is public (issue 70): a `_name` is its own module's business."
    assert private_crossings("from .core import _helper, check_dims\nfrom . import encoder as enc\nenc._LOCK = 1\n"
                             "import matryoshka_lab.runs as runs\nruns._tail()\nfrom __future__ import annotations\n"
                             "from .eval import __all__\nself._x = 1\nfrom matryoshka_lab import me as lib\nlib._run", own="me") == [
                                 "core._helper", "enc._LOCK", "runs._tail"]
    found = {str(p.relative_to(LIB)): c for p in sorted(LIB.rglob("*.py")) if p.name != "_modidx.py"
             if (c := private_crossings(p.read_text(encoding="utf-8"), p.stem))}
    assert found == {}, f"private names used across modules: {found}"


def imports_studies(source: str) -> bool:
    "Whether python source imports matryoshka_lab.studies (relatively from the package, or absolutely)."
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            relative = node.level == 1 and (module.split(".")[0] == "studies" or (not module and any(a.name == "studies" for a in node.names)))
            if relative or module.startswith("matryoshka_lab.studies"):
                return True
        elif isinstance(node, ast.Import) and any(a.name.startswith("matryoshka_lab.studies") for a in node.names):
            return True
    return False


def test_no_library_module_imports_a_study():
    "matryoshka_lab/studies/ imports the library; nothing in the library imports it."
    assert [imports_studies(s) for s in ("from .studies.report import x", "from . import studies", "import matryoshka_lab.studies.baselines",
                                         "from .fractal import x", "from ..core import y")] == [True, True, True, False, False]
    assert [p.name for p in LIB.glob("*.py") if imports_studies(p.read_text(encoding="utf-8"))] == []


def test_trainer_names_no_method():
    tree = ast.parse((LIB / "trainer.py").read_text(encoding="utf-8"))
    named = sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in BUILTIN})
    assert named == [], f"trainer.py names methods {named}: it should reach them through matryoshka_lab.methods"
    assert not library_imports(LIB / "trainer.py") & {"mipic", "mic", "distill"}


def test_every_builtin_is_registered_by_the_module_that_defines_it():
    for name, module in BUILTIN.items():
        method = get_method(name)
        assert (method.name, type(method).__module__) == (name, module)


def test_fractal_config_protocol_label_means_its_values():
    "FractalConfig(protocol=P) carries P's options (PROTOCOLS is their only source); an option given stays given."
    from matryoshka_lab.fractal_runner import PROTOCOLS, FractalConfig, fractal_config, protocol_overrides
    for name, options in PROTOCOLS.items():
        cfg = FractalConfig(protocol=name)
        assert {k: getattr(cfg, k) for k in options} == options and cfg == fractal_config(name)
        assert protocol_overrides(cfg) == {}
    mixed = FractalConfig(protocol="paper-text", schedule="constant")
    assert (mixed.schedule, mixed.body, protocol_overrides(mixed)) == ("constant", "linear", {"schedule": "constant"})


def test_every_method_is_encoded_as_it_declares_and_gradient_share_works_for_each(tiny_encoder, tmp_path):
    "One batch function for the trainer, the adapter and gradient_share: token states, one view, tuple targets (distill_nc)."
    import math
    import numpy as np
    from matryoshka_lab.config import make_config
    from matryoshka_lab.gradients import gradient_share
    from matryoshka_lab.methods import TrainData, method_names
    rng = np.random.default_rng(0)
    texts = [f"request number {i} about topic {i % 4}" for i in range(16)]
    own = {"distill_nc": (rng.normal(size=(16, 48)).astype(np.float32), np.arange(16) % 4)}   # teacher [N, 48], labels
    options = {"ese": {"compression_size": 8}}             # below the tiny model's 32 features
    for name in method_names():
        data = TrainData(texts, target=own.get(name))
        cfg = make_config({"run_dir": str(tmp_path / name), "method": name, "batch_size": 8, "max_length": 16,
                           "dims": [8, 16, 32], "loss_options": options.get(name, {})})
        share = gradient_share(cfg, encoder=tiny_encoder("bert"), data=data)
        assert 0 < share["task_share"] <= 1 and math.isfinite(share["grad_norm"]) and share["grad_norm"] > 0, (name, share)
        if name in ("base", "mrl", "distill_nc"):          # their whole objective is the task (Method.task_loss)
            assert abs(share["task_share"] - 1) < 1e-9 and share["rest"] == 0, (name, share)


def test_notebooks_are_numbered_in_dependency_order():
    "A library notebook's module imports only modules of lower-numbered notebooks (nbs/NN_name.ipynb, `#| default_exp`)."
    number = {}
    for nb in (ROOT / "nbs").glob("[0-9][0-9]_*.ipynb"):
        found = re.search(r"#\| default_exp (\w+)", nb.read_text(encoding="utf-8"))
        if found:
            number[found.group(1)] = int(nb.name[:2])
    assert set(number) == {p.stem for p in LIB.glob("*.py")} - {"__init__", "_modidx"}, "every module has its notebook"
    later = sorted((m, d) for m in number for d in library_imports(LIB / f"{m}.py") if number[d] >= number[m])
    assert later == [], f"modules importing a module of a later (or the same) notebook number: {later}"
