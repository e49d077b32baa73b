"""This project's own studies, apart from the library: the variant registry and sweeps of the baseline comparison
(`baselines`), the distillation comparison (`distill`), the fractal paper's printed numbers (`fractal_paper`) and the
result tables of the README and RESULTS.md (`report`). They import the library; no library module imports them.
Their notebooks are nbs/studies/."""
