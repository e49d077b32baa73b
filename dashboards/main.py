"""matryoshka_lab workbench dashboard (first version): browse layer x dim grids written under the runs root.

    panel serve dashboards/ --address 127.0.0.1 --port 5006

Runs are found under $MATRYOSHKA_LAB_RUNS (default ./runs): every grid.csv below it (the demo writes
runs/demo/grid.csv; `matryoshka-lab eval --out runs/NAME/grid.csv` adds more). Read-only; imports no torch.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import panel as pn

from matryoshka_lab.plots import grid_table, headline, plot_grid

RUNS_ENV = "MATRYOSHKA_LAB_RUNS"
COLUMNS = ["task", "layer", "dim", "metric", "value"]


def runs_root() -> Path:
    return Path(os.environ.get(RUNS_ENV) or "runs").resolve()


def find_grids(root: Path) -> dict[str, Path]:
    "grid.csv files under root, by their path relative to root; anything resolving outside root is ignored."
    if not root.is_dir():
        return {}
    found = {}
    for path in sorted(root.rglob("grid.csv")):
        real = path.resolve()
        if real.is_file() and real.is_relative_to(root):   # no symlinks leading out of the runs root
            found[str(path.relative_to(root))] = real
    return found


def read_grid(path: Path) -> pd.DataFrame:
    "A grid CSV, or an empty frame with the right columns when it is missing, partial or malformed."
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError):
        return pd.DataFrame(columns=COLUMNS)
    if list(df.columns) != COLUMNS:
        return pd.DataFrame(columns=COLUMNS)
    return df.dropna(subset=["task", "layer", "dim", "metric"])


def build_app(root: Path | None = None) -> pn.Column:
    root = root or runs_root()
    grids = find_grids(root)
    title = pn.pane.Markdown(f"# matryoshka_lab: layer x dim grids\nRuns root: `{root}`")
    if not grids:
        return pn.Column(title, pn.pane.Markdown(
            f"No `grid.csv` under the runs root yet. Run `matryoshka-lab demo` (writes runs/demo/grid.csv) or "
            f"`matryoshka-lab eval ... --out runs/NAME/grid.csv`, or set ${RUNS_ENV}."))
    run = pn.widgets.Select(label="Grid", options=list(grids))
    pair = pn.widgets.Select(label="Task / metric")
    state = {"df": pd.DataFrame(columns=COLUMNS)}

    def load(_=None):
        state["df"] = read_grid(grids[run.value])
        options = [f"{t} / {m}" for t, m in sorted(set(zip(state["df"].task, state["df"].metric)))]
        heads = [f"{t} / {m}" for t, m in headline(state["df"])] if len(state["df"]) else []
        pair.options = options
        pair.value = heads[0] if heads else (options[0] if options else None)

    def view(choice, _run):
        if not choice:
            return pn.pane.Markdown("This grid file is empty or malformed.")
        task, metric = choice.split(" / ")
        return pn.Row(pn.pane.Plotly(plot_grid(state["df"], task, metric)),
                      pn.pane.DataFrame(grid_table(state["df"], task, metric).round(2), width=420))

    run.param.watch(load, "value")
    load()
    return pn.Column(title, pn.Row(run, pair), pn.bind(view, pair, run))


if __name__.startswith("bokeh"):
    pn.extension("plotly")
    build_app().servable(title="matryoshka_lab")
