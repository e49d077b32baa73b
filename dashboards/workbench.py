"""The workbench's Panel views: live run monitor, snapshots with a step slider, compare runs, grid browser.

Everything that decides something (which runs may be shown, incremental reads, snapshots, figures, export) lives in
matryoshka_lab.dashboard (nbs/19_dashboard.ipynb) and is tested there; this file only lays it out. Read-only; no torch.
"""
from __future__ import annotations

import io
import ipaddress
import json
import os
import time
from pathlib import Path

import pandas as pd
import panel as pn

from matryoshka_lab.dashboard import (MetricsTail, RUNS_ENV, compare_frame, figure_html, figure_png, fractal_results,
                                      list_arrays, list_snapshots, load_snapshot, resolve_run, run_file, runs_root,
                                      safe_runs, snapshot_figure, steerability_curves)
from matryoshka_lab.plots import grid_table, headline, plot_grid

PERIOD_MS = 500        # the live monitor polls metrics.jsonl this often
SLOW_EVERY = 10        # ticks between re-listing runs and snapshots (5 s)
PLOT_EVERY_S = 1.0     # curves are redrawn at most this often; the step pane on every tick
STEP_CLASS = "ml-step" # the element showing "step N" (tests find it by this class)
COLUMNS = ["task", "layer", "dim", "metric", "value"]
NOT_DEFAULT = ("lr", "grad_norm")


def client_allowed(ip: str | None, env=os.environ) -> bool:
    "Loopback clients always; others only with MATRYOSHKA_LAB_ALLOW_REMOTE=1 (an unknown address counts as remote)."
    if env.get("MATRYOSHKA_LAB_ALLOW_REMOTE") == "1":
        return True
    try:
        return ipaddress.ip_address((ip or "").split("%")[0]).is_loopback
    except ValueError:
        return False


# ---- grid browser (the first dashboard) ----
def find_grids(root: Path) -> dict[str, Path]:
    "grid.csv files under root, by their path relative to root; anything resolving outside root is ignored."
    root = Path(root).resolve()
    found = {}
    for name in safe_runs(root):
        try:
            path = run_file(root, name, "grid.csv")
        except ValueError:
            continue
        if path.is_file():
            found[f"{name}/grid.csv"] = path.resolve()
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


def grid_view(root: Path):
    grids = find_grids(root)
    if not grids:
        return pn.pane.Markdown("No `grid.csv` under the runs root yet (the trainer writes one at evaluations; "
                                "`matryoshka-lab demo` writes runs/demo/grid.csv).")
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
        fig = plot_grid(state["df"], task, metric)
        return pn.Column(pn.Row(pn.pane.Plotly(fig), pn.pane.DataFrame(grid_table(state["df"], task, metric).round(2),
                                                                      width=420)),
                         export_row(lambda: fig, f"grid_{task}_{metric}"))

    run.param.watch(load, "value")
    load()
    return pn.Column(pn.Row(run, pair), pn.bind(view, pair, run))


# ---- small helpers ----
def empty_figure(text: str):
    import plotly.graph_objects as go
    fig = go.Figure()
    return fig.update_layout(title=text, height=320, width=640, xaxis_visible=False, yaxis_visible=False)


def lines_figure(df: pd.DataFrame, names: list[str], title: str, y_title: str):
    "One line per metric name of a MetricsTail.frame() table (NaN values leave gaps)."
    import plotly.graph_objects as go
    df = df[df.name.isin(names)]
    if df.empty:
        return empty_figure(f"{title}: nothing yet")
    fig = go.Figure([go.Scatter(x=g.step, y=g.value, mode="lines", name=n) for n, g in df.groupby("name", sort=False)])
    return fig.update_layout(title=title, xaxis_title="step", yaxis_title=y_title, height=360, width=760)


def export_row(get_fig, stem: str) -> pn.Row:
    "HTML and PNG download buttons for the figure get_fig() returns at click time."
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)
    return pn.Row(
        pn.widgets.FileDownload(callback=lambda: io.BytesIO(figure_html(get_fig())), filename=f"{safe}.html",
                                label="Export HTML", width=150),
        pn.widgets.FileDownload(callback=lambda: io.BytesIO(figure_png(get_fig())), filename=f"{safe}.png",
                                label="Export PNG", width=150))


def default_curves(names: list[str], pick) -> list[str]:
    return [n for n in names if pick(n)][:6] or names[:4]


def _read_config(run_dir: Path) -> dict:
    try:
        cfg = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        return cfg if isinstance(cfg, dict) else {}
    except (OSError, ValueError):
        return {}


class Workbench:
    "One browser session's views over the runs root; tick() is the periodic callback."
    def __init__(self, root: Path | None = None, run: str | None = None):
        self.root = Path(root or runs_root()).resolve()
        self.names = safe_runs(self.root)
        self.tail: MetricsTail | None = None
        self.run_dir: Path | None = None
        self.config: dict = {}
        self.ticks, self._plotted, self._dirty = 0, 0.0, False
        self._cmp_tails: dict[str, MetricsTail] = {}

        first = run if run in self.names else (self.names[0] if self.names else None)
        self.picker = pn.widgets.Select(label="Run", options=self.names, value=first, width=320)
        self.refresh = pn.widgets.Button(label="Refresh runs", width=120)
        self.step = pn.pane.Markdown("step -", css_classes=[STEP_CLASS], name="step", width=160)
        self.status = pn.pane.Markdown("", css_classes=["ml-status"], width=520)

        self.train_choice = pn.widgets.MultiChoice(label="Training curves", options=[], value=[], width=760)
        self.eval_choice = pn.widgets.MultiChoice(label="Eval metrics", options=[], value=[], width=760)
        self.train_plot = pn.pane.Plotly(empty_figure("no run selected"))
        self.eval_plot = pn.pane.Plotly(empty_figure("no eval metrics yet"))

        self.array_select = pn.widgets.Select(label="Snapshot", options=[], width=220)
        self.snap_slider = pn.widgets.DiscreteSlider(label="Step", options=[0], value=0, width=420, visible=False)
        self.layer_input = pn.widgets.IntInput(label="Layer (variance)", value=-1, width=140)
        self.snap_plot = pn.pane.Plotly(empty_figure("no snapshots in this run"))
        self.steer_select = pn.widgets.Select(label="Steerability (Fractal result)", options=[], width=320)
        self.steer_plot = pn.pane.Plotly(empty_figure("no Fractal result JSON in this run"))

        self.cmp_runs = pn.widgets.MultiChoice(label="Runs (the first is the reference)", options=self.names,
                                               value=self.names[:2], width=760)
        self.cmp_pattern = pn.widgets.TextInput(label="Metric pattern (glob on the name)", value="*", width=360)
        self.cmp_button = pn.widgets.Button(label="Compare", width=120)
        self.cmp_table = pn.pane.HTML("", sizing_mode="stretch_width")
        self.cmp_plot = pn.pane.Plotly(empty_figure("choose runs"))

        self.picker.param.watch(lambda e: self.open_run(e.new), "value")
        self.refresh.on_click(lambda e: self.refresh_runs())
        self.train_choice.param.watch(lambda e: self.redraw(), "value")
        self.eval_choice.param.watch(lambda e: self.redraw(), "value")
        self.array_select.param.watch(lambda e: self.refresh_snapshots(follow=True), "value")
        self.snap_slider.param.watch(lambda e: self.draw_snapshot(), "value")
        self.layer_input.param.watch(lambda e: self.draw_snapshot(), "value")
        self.steer_select.param.watch(lambda e: self.draw_steerability(), "value")
        self.cmp_button.on_click(lambda e: self.compare())
        self.cmp_pattern.param.watch(lambda e: self.compare(), "value")
        self.cmp_runs.param.watch(lambda e: self.compare(), "value")
        self.layout = self._layout()
        self.open_run(first)
        self.compare()

    def _layout(self):
        title = pn.pane.Markdown(f"# matryoshka_lab workbench\nRuns root: `{self.root}` (set ${RUNS_ENV})")
        if not self.names:
            title.object += (f"\n\nNo runs under the runs root yet (a run is a folder with metrics.jsonl, config.json "
                             f"or grid.csv). Train one, or press Refresh runs.")
        monitor = pn.Column(self.train_choice, self.train_plot, export_row(lambda: self.train_plot.object, "train_curves"),
                            self.eval_choice, self.eval_plot, export_row(lambda: self.eval_plot.object, "eval_metrics"),
                            name="Monitor")
        snaps = pn.Column(pn.Row(self.array_select, self.snap_slider, self.layer_input), self.snap_plot,
                          export_row(lambda: self.snap_plot.object, "snapshot"),
                          self.steer_select, self.steer_plot, export_row(lambda: self.steer_plot.object, "steerability"),
                          name="Snapshots")
        compare = pn.Column(self.cmp_runs, pn.Row(self.cmp_pattern, self.cmp_button), self.cmp_table, self.cmp_plot,
                            export_row(lambda: self.cmp_plot.object, "compare"), name="Compare")
        grids = pn.Column(grid_view(self.root), name="Grids")
        self.tabs = pn.Tabs(monitor, snaps, compare, grids, dynamic=False)
        return pn.Column(title, pn.Row(self.picker, self.refresh, self.step, self.status), self.tabs)

    # ---- run selection ----
    def open_run(self, name: str | None) -> None:
        self.tail, self.run_dir, self.config = None, None, {}
        self.step.object = "step -"
        if name:
            try:
                self.run_dir = resolve_run(self.root, name)
                self.tail = MetricsTail(run_file(self.root, name, "metrics.jsonl"), root=self.root)
            except ValueError as err:
                self.status.object = f"refused: {err}"
            else:
                self.config = _read_config(self.run_dir)
                self.status.object = ""
        self.train_choice.options, self.train_choice.value = [], []
        self.eval_choice.options, self.eval_choice.value = [], []
        self.poll()
        self.redraw()
        self.refresh_arrays()
        self.refresh_fractal()

    def refresh_runs(self) -> None:
        self.names = safe_runs(self.root)
        keep = [self.picker.value] if self.picker.value and self.picker.value not in self.names else []
        self.picker.options = self.names + keep           # a run deleted while open stays selected
        self.cmp_runs.options = self.names + [n for n in self.cmp_runs.value if n not in self.names]

    # ---- live monitor ----
    def poll(self) -> int:
        if self.tail is None:
            return 0
        new = self.tail.poll()
        if self.tail.last_step is not None:
            self.step.object = f"step {self.tail.last_step}"
        if self.tail.missing:
            self.status.object = "metrics.jsonl is missing (run not started, or deleted): showing what was read"
        elif self.tail.bad:
            self.status.object = f"{self.tail.bad} malformed line(s) skipped"
        if new:
            self._dirty = True
            self._update_choices()
        return new

    def _update_choices(self) -> None:
        train = sorted(n for s, n in self.tail.series if s == "train")
        evals = sorted(n for s, n in self.tail.series if s != "train")
        if train != list(self.train_choice.options):
            self.train_choice.options = train
            if not self.train_choice.value:
                self.train_choice.value = default_curves(train, lambda n: n == "loss" or ("/" not in n and n not in NOT_DEFAULT))
        if evals != list(self.eval_choice.options):
            self.eval_choice.options = evals
            if not self.eval_choice.value:
                self.eval_choice.value = default_curves(evals, lambda n: n.endswith("spearman"))

    def redraw(self) -> None:
        self._dirty, self._plotted = False, time.monotonic()
        if self.tail is None:
            self.train_plot.object = empty_figure("no run selected")
            self.eval_plot.object = empty_figure("")
            return
        df = self.tail.frame()
        tdf = df[df.split == "train"]
        self.train_plot.object = lines_figure(tdf, list(self.train_choice.value), "training loss and parts", "value")
        self.eval_plot.object = lines_figure(df[df.split != "train"], list(self.eval_choice.value), "eval metrics", "value")

    def tick(self) -> None:
        "The periodic callback: poll the tail, update the step pane; every few ticks re-list runs and snapshots."
        try:
            self.ticks += 1
            self.poll()
            if self._dirty and time.monotonic() - self._plotted >= PLOT_EVERY_S:
                self.redraw()
            if self.ticks % SLOW_EVERY == 0:
                self.refresh_runs()
                self.refresh_arrays()
        except Exception as err:        # a bad file must never stop the periodic callback
            self.status.object = f"error while refreshing: {type(err).__name__}: {err}"

    # ---- snapshots ----
    def refresh_arrays(self) -> None:
        arrays = list_arrays(self.run_dir) if self.run_dir else []
        if arrays != list(self.array_select.options):
            self.array_select.options = arrays
        if self.array_select.value not in arrays:
            self.array_select.value = arrays[0] if arrays else None   # fires refresh_snapshots(follow=True)
        self.refresh_snapshots(follow=False)

    def refresh_snapshots(self, follow: bool) -> None:
        name = self.array_select.value
        steps = list_snapshots(self.run_dir, name) if (self.run_dir and name) else []
        if not steps:
            self.snap_slider.visible = False
            self.snap_plot.object = empty_figure("no snapshots in this run" if not name else f"{name}: no snapshots")
            return
        at_end = self.snap_slider.value == (self.snap_slider.options or [None])[-1]
        if steps != list(self.snap_slider.options):
            value = steps[-1] if (follow or at_end or self.snap_slider.value not in steps) else self.snap_slider.value
            self.snap_slider.options = steps
            self.snap_slider.value = value
            self.snap_slider.visible = True
            self.draw_snapshot()
        elif follow:
            self.snap_slider.visible = True
            self.draw_snapshot()

    def draw_snapshot(self) -> None:
        name, step = self.array_select.value, self.snap_slider.value
        if not (self.run_dir and name and self.snap_slider.visible):
            return
        try:
            a = load_snapshot(self.run_dir, name, step)
            dims = self.config.get("dims")
            L = a.shape[0] if a.ndim == 2 else 1
            layer = max(-L, min(L - 1, int(self.layer_input.value or -1)))
            self.snap_plot.object = snapshot_figure(name, a, dims=dims if isinstance(dims, list) else None, layer=layer,
                                                    step=step)
        except (OSError, ValueError) as err:
            self.snap_plot.object = empty_figure(f"{name} at step {step}: cannot read ({type(err).__name__})")

    def refresh_fractal(self) -> None:
        self._fractal = fractal_results(self.run_dir) if self.run_dir else {}
        self.steer_select.options = [f"{f}: {c}" for f, res in self._fractal.items() for c in res.get("summary", {})]
        self.draw_steerability()

    def draw_steerability(self) -> None:
        choice = self.steer_select.value
        if not choice:
            self.steer_plot.object = empty_figure("no Fractal result JSON in this run")
            return
        f, cond = choice.split(": ", 1)
        try:
            self.steer_plot.object = steerability_curves(self._fractal[f], cond)
        except (KeyError, TypeError, ValueError) as err:
            self.steer_plot.object = empty_figure(f"{choice}: unreadable ({type(err).__name__})")

    # ---- compare ----
    def compare(self) -> None:
        import plotly.graph_objects as go
        latest = {}
        for name in self.cmp_runs.value:
            if name not in self._cmp_tails:
                try:
                    self._cmp_tails[name] = MetricsTail(run_file(self.root, name, "metrics.jsonl"), root=self.root)
                except ValueError:
                    continue
            t = self._cmp_tails[name]
            t.poll()
            latest[name] = t.latest()
        for gone in set(self._cmp_tails) - set(self.cmp_runs.value):
            del self._cmp_tails[gone]
        df = compare_frame(latest, self.cmp_pattern.value or "*")
        if df.empty:
            self.cmp_table.object = "<p>Nothing to compare: choose runs and a pattern matching their metric names.</p>"
            self.cmp_plot.object = empty_figure("nothing to compare")
            return
        deltas = [c for c in df.columns if str(c).startswith("Δ ")]
        table = df.copy()
        table.index = [f"{s}: {n}" for s, n in table.index]

        def colour(v):
            if pd.isna(v) or v == 0:
                return ""
            return "background-color: #c8e6c9" if v > 0 else "background-color: #ffcdd2"

        styler = table.style.format("{:.4g}", na_rep="–").map(colour, subset=deltas)
        self.cmp_table.object = ("<p>Latest value per run; Δ = run minus the first run (green above, red below).</p>"
                                 + styler.to_html())
        runs = [c for c in df.columns if c not in deltas]
        top = table.head(30)
        fig = go.Figure([go.Bar(name=r, x=list(top.index), y=top[r]) for r in runs])
        self.cmp_plot.object = fig.update_layout(barmode="group", title="latest values", height=420, width=900)


def build_app(root: Path | None = None, run: str | None = None) -> Workbench:
    "The workbench for a runs root (default $MATRYOSHKA_LAB_RUNS or ./runs); serve .layout, call .tick periodically."
    return Workbench(root, run)
