"""README.md is nbs/index.ipynb rendered; its Quick start holds exactly the two commands CI runs; the marked tables of
the README and of RESULTS.md are those the committed result files give (matryoshka_lab.studies.report.fill_tables).

    python tests/test_readme.py     # regenerate the marked tables (nbs/index.ipynb, RESULTS.md) and results/figures, rewrite README.md
"""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "nbs" / "index.ipynb"
RESULTS_MD = ROOT / "RESULTS.md"
RESULTS = ROOT / "results"


def fill_tables(text: str) -> str:
    "text with its marked tables regenerated from results/ (imported here: .ci/run reads this file before it installs the library)."
    from matryoshka_lab.studies.report import fill_tables as fill
    return fill(text, RESULTS)


def render_index() -> str:
    "Markdown cells with their marked tables regenerated, code cells as python blocks (hidden cells and nbdev directives left out)."
    cells = json.loads(INDEX.read_text(encoding="utf-8"))["cells"]
    parts = []
    for cell in cells:
        src = "".join(cell["source"]).strip()
        if cell["cell_type"] == "markdown":
            parts.append(fill_tables(src))
        elif src and "#| hide" not in src:
            code = "\n".join(l for l in src.splitlines() if not l.startswith("#|")).strip()
            parts.append(f"```python\n{code}\n```")
    return "\n\n".join(parts) + "\n"


def refresh_index_tables() -> int:
    "Regenerate the marked tables of nbs/index.ipynb's markdown cells in place; the number of cells changed."
    nb = json.loads(INDEX.read_text(encoding="utf-8"))
    changed = 0
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and fill_tables(src) != src:
            cell["source"] = fill_tables(src).splitlines(keepends=True)
            changed += 1
    if changed:
        INDEX.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return changed


def quick_start_commands(readme: str) -> list[str]:
    "The command lines of the first code block under '## Quick start'."
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S).group(1)
    return [l.strip() for l in block.splitlines() if l.strip() and not l.strip().startswith("#")]


def test_readme_is_rendered_index():
    assert (ROOT / "README.md").read_text(encoding="utf-8") == render_index(), \
        "README.md is stale: run `python tests/test_readme.py`"


def test_index_tables_are_the_result_files():
    cells = json.loads(INDEX.read_text(encoding="utf-8"))["cells"]
    stale = [cell.get("id") for cell in cells if cell["cell_type"] == "markdown"
             and fill_tables("".join(cell["source"])) != "".join(cell["source"])]
    assert stale == [], f"the marked tables of nbs/index.ipynb cells {stale} differ from results/: run `python tests/test_readme.py`"


def test_quick_start_has_the_two_commands_ci_runs():
    cmds = quick_start_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(cmds) == 2, cmds
    assert "pip install" in cmds[0] and "matryoshka-lab demo" in cmds[0]
    assert "pytest" in cmds[1]
    assert "quick_start_commands" in (ROOT / ".ci" / "run").read_text(), ".ci/run must run the README's commands"


def test_results_page_tables_are_the_result_files():
    text = RESULTS_MD.read_text(encoding="utf-8")
    assert "<!-- table:" in text and fill_tables(text) == text, \
        "the marked tables of RESULTS.md differ from results/: run `python tests/test_readme.py`"


def test_readme_is_short_and_points_to_the_results():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200 and "RESULTS.md" in readme


def prose_paragraphs(text: str) -> list[tuple[int, str]]:
    "(first line, text) of every prose paragraph: lines between blank lines, a list item its own; tables, markers, figures and headings are not prose."
    paragraphs, lines, start = [], [], 0
    for i, line in enumerate(text.splitlines() + [""], 1):
        if not line.strip() or line.startswith(("|", "<!--", "![", "#")):
            if lines:
                paragraphs.append((start, " ".join(lines)))
            lines = []
            continue
        if line.startswith(("- ", "* ", "1. ")) or re.match(r"\d+\. ", line):
            if lines:
                paragraphs.append((start, " ".join(lines)))
            lines = []
        if not lines:
            start = i
        lines.append(line.strip())
    return paragraphs


def heading_anchors(text: str) -> set[str]:
    "The anchors GitHub gives the page's headings: lower case, punctuation but hyphens dropped, spaces as hyphens."
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_results_page_opens_with_its_findings():
    "RESULTS.md's first section is what we learned: 8-12 findings, each with a result file and a link to the section that shows it; every in-page link lands on a heading, and no paragraph runs over 150 words."
    text = RESULTS_MD.read_text(encoding="utf-8")
    first = text.split("\n## ", 2)[1]
    assert first.startswith("What we learned"), first.splitlines()[0]
    findings = [p for _, p in prose_paragraphs(first) if re.match(r"\d+\. ", p)]
    assert 8 <= len(findings) <= 12, len(findings)
    assert [f for f in findings if "results/" not in f or "](#" not in f] == []
    anchors = heading_anchors(text)
    assert sorted(set(re.findall(r"\]\(#([^)]+)\)", text)) - anchors) == []
    assert [(line, len(p.split())) for line, p in prose_paragraphs(text) if len(p.split()) > 150] == []


def test_readme_and_results_link_every_figure():
    "Every image the README and RESULTS.md show is a committed figure, and every figure report.FIGURES draws is shown."
    from matryoshka_lab.studies.report import FIGURES
    pages = (ROOT / "README.md").read_text(encoding="utf-8") + RESULTS_MD.read_text(encoding="utf-8")
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", pages)
    assert [p for p in linked if not (ROOT / p).is_file()] == [], linked
    assert sorted(f"results/figures/{name}.png" for name in FIGURES) == sorted(p for p in linked if p.startswith("results/figures/"))


def test_deploy_section_runs_as_written(data_dir, tmp_path, monkeypatch):
    "The README's deploy section, its commands and code as written (in a fresh folder, the data from $MATRYOSHKA_LAB_DATA); its funnel, on a corpus DEFAULT_SHORTLIST was not chosen on, keeps 0.99 of exact search's nDCG@10."
    import subprocess
    import numpy as np
    from matryoshka_lab.deploy import embed_texts
    from matryoshka_lab.eval import retrieval_metrics
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Deploying", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    assert [lang for lang, _ in blocks] == ["bash", "python", "python"], blocks
    monkeypatch.setenv("MATRYOSHKA_LAB_DATA", str(data_dir))
    monkeypatch.chdir(tmp_path)
    names = {}
    for lang, code in blocks:
        if lang == "bash":
            res = subprocess.run(code.replace("\\\n", " "), shell=True, capture_output=True, text=True, timeout=900)
            assert res.returncode == 0, res.stderr[-3000:]
        else:
            exec(compile(code, "README.md", "exec"), names)
    assert (tmp_path / "runs" / "budget" / "grid.csv").is_file()
    index, task, hits = names["index"], names["task"], names["hits"]
    assert hits.shape == (3, 10) and set(hits.ravel()) <= set(index.ids)             # ids out, for texts in
    row = {d: i for i, d in enumerate(index.ids)}
    q = embed_texts(index.encoder, task.queries, progress=False)
    funnel = np.vectorize(row.get)(index.search(q, k=10))                            # every query, the default shortlist
    exact = np.argsort(-(q / np.linalg.norm(q, axis=1, keepdims=True)) @ index.full.T, axis=1, kind="stable")[:, :10]
    kept = retrieval_metrics(funnel, task.qrels)["ndcg_at_10"] / retrieval_metrics(exact, task.qrels)["ndcg_at_10"]
    assert kept >= 0.99, kept


def test_references_section_runs_as_written(data_dir, tmp_path, monkeypatch):
    "The README's references section as written, in a fresh folder with a copy of examples/ (the fit set, STS-B train, from $MATRYOSHKA_LAB_DATA): the grid holds each reference's cells beside the model's, the Budget tab draws them, the exported PCA gives the PCA-64 prefix."
    import shutil
    import subprocess
    import pandas as pd
    import torch
    from sentence_transformers import SentenceTransformer
    from matryoshka_lab.encoder import Encoder
    from matryoshka_lab.grid_tabs import BudgetBrowser
    from matryoshka_lab.transforms import load_transform
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Is the training worth it?", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    assert [lang for lang, _ in blocks] == ["bash", "python"], blocks
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.setenv("MATRYOSHKA_LAB_DATA", str(data_dir))
    monkeypatch.chdir(tmp_path)
    res = subprocess.run(blocks[0][1].replace("\\\n", " ").strip() + " --no-progress", shell=True, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    exec(compile(blocks[1][1], "README.md", "exec"), {})
    grid = pd.read_csv(tmp_path / "runs" / "refs" / "grid.csv")
    assert list(grid["transform"].unique()) == ["none", "pca", "random", "adaptor", "csr"]
    assert set(grid.task) == {"faq_pairs", "sts"} and set(grid.layer) == {6}
    budget = BudgetBrowser(tmp_path / "runs")                         # the Budget tab: every transform beside the model
    assert budget.task.value == "faq_pairs"
    spec = budget.body.objects[0].object.to_dict()
    assert spec["layer"][0]["encoding"]["shape"]["scale"]["domain"] == ["none", "pca", "random", "adaptor", "csr"]
    texts = ["How do I reset my password?", "The office opens at nine."]
    pca = load_transform(tmp_path / "runs" / "refs" / "grid.transforms" / "pca")
    ours = pca.apply(Encoder.from_pretrained("embedded").encode(texts, layers=[6], progress=False), [6])[0, :, :64]
    theirs = SentenceTransformer(str(tmp_path / "runs" / "refs" / "pca_model"), truncate_dim=64, device="cpu").encode(texts, convert_to_tensor=True)
    assert torch.allclose(theirs, ours, atol=1e-5), (theirs - ours).abs().max()


if __name__ == "__main__":
    from matryoshka_lab.studies.report import write_figures
    print(f"regenerated the tables of {refresh_index_tables()} cells of nbs/index.ipynb")
    RESULTS_MD.write_text(fill_tables(RESULTS_MD.read_text(encoding="utf-8")), encoding="utf-8")
    print("regenerated the tables of RESULTS.md")
    print(f"drew {len(write_figures(RESULTS))} figures into results/figures")
    (ROOT / "README.md").write_text(render_index(), encoding="utf-8")
    print("wrote README.md")
