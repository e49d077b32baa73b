"""Methods as plugins: the library's import graph has no cycle, and the trainer knows methods only through the registry."""
import ast
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


def test_trainer_names_no_method():
    tree = ast.parse((LIB / "trainer.py").read_text(encoding="utf-8"))
    named = sorted({n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in BUILTIN})
    assert named == [], f"trainer.py names methods {named}: it should reach them through matryoshka_lab.methods"
    assert not library_imports(LIB / "trainer.py") & {"mipic", "mic", "distill"}


def test_every_builtin_is_registered_by_the_module_that_defines_it():
    for name, module in BUILTIN.items():
        method = get_method(name)
        assert (method.name, type(method).__module__) == (name, module)
