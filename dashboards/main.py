"""matryoshka_lab workbench: live run monitor, snapshots, compare runs, grid browser.

    panel serve dashboards/ --address 127.0.0.1 --port 5006        # then open http://127.0.0.1:5006/dashboards

`panel serve DIR` serves this folder as one directory app; the views live in the library, matryoshka_lab.workbench
(nbs/24_workbench.ipynb), which also shows them inline in a notebook: `from matryoshka_lab.workbench import show;
show("runs", "mrl")`. Runs are found under $MATRYOSHKA_LAB_RUNS (default ./runs): every folder below it holding
metrics.jsonl or config.json (a folder with only a grid.csv is in the Grids and Budget tabs), never anything outside
it. `?run=NAME` in the address opens that run, once it has started if it has not yet.
Read-only; imports no torch. Localhost only, unless told otherwise: `panel serve` without --address listens on every
interface, so a session from a non-loopback client is refused unless $MATRYOSHKA_LAB_ALLOW_REMOTE=1, and so is a
session whose Host header is not localhost, 127.0.0.1 or [::1] (a DNS-rebinding page: tornado lets a websocket in
when its Origin equals its Host, whatever --allow-websocket-origin says; matryoshka_lab.serving.session_allowed).
Pass --address 127.0.0.1 to not listen on other interfaces at all.
"""
from __future__ import annotations

import panel as pn

from matryoshka_lab.dashboard import runs_root
from matryoshka_lab.serving import session_allowed
from matryoshka_lab.workbench import PERIOD_MS, build_app


def _query_run() -> str | None:
    args = getattr(pn.state, "session_args", None) or {}
    vals = args.get("run") or []
    return vals[0].decode("utf-8", "replace") if vals else None


if __name__.startswith("bokeh"):
    pn.extension("vega")
    if session_allowed():                       # a loopback client under a loopback Host (no DNS rebinding)
        wb = build_app(runs_root(), _query_run())
        pn.state.add_periodic_callback(wb.tick, period=PERIOD_MS)
        wb.layout.servable(title="matryoshka_lab workbench")
    else:
        pn.pane.Markdown("Refused: this workbench answers local clients at 127.0.0.1 or localhost only (set "
                         "MATRYOSHKA_LAB_ALLOW_REMOTE=1 on the server to allow others).").servable(title="matryoshka_lab workbench")
