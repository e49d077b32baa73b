"""README.md is nbs/index.ipynb rendered; its Quick start holds exactly the two commands CI runs.

    python tests/test_readme.py     # rewrite README.md from nbs/index.ipynb
"""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def render_index() -> str:
    "Markdown cells verbatim, code cells as python blocks (hidden cells and nbdev directives left out)."
    cells = json.loads((ROOT / "nbs" / "index.ipynb").read_text(encoding="utf-8"))["cells"]
    parts = []
    for cell in cells:
        src = "".join(cell["source"]).strip()
        if cell["cell_type"] == "markdown":
            parts.append(src)
        elif src and "#| hide" not in src:
            code = "\n".join(l for l in src.splitlines() if not l.startswith("#|")).strip()
            parts.append(f"```python\n{code}\n```")
    return "\n\n".join(parts) + "\n"


def quick_start_commands(readme: str) -> list[str]:
    "The command lines of the first code block under '## Quick start'."
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1)
    return [l.strip() for l in block.splitlines() if l.strip() and not l.strip().startswith("#")]


def test_readme_is_rendered_index():
    assert (ROOT / "README.md").read_text(encoding="utf-8") == render_index(), \
        "README.md is stale: run `python tests/test_readme.py`"


def test_quick_start_has_the_two_commands_ci_runs():
    cmds = quick_start_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(cmds) == 2, cmds
    assert "pip install" in cmds[0] and "matryoshka-lab demo" in cmds[0]
    assert "pytest" in cmds[1]
    assert "quick_start_commands" in (ROOT / ".ci" / "run").read_text(), ".ci/run must run the README's commands"


if __name__ == "__main__":
    (ROOT / "README.md").write_text(render_index(), encoding="utf-8")
    print("wrote README.md")
