"""Rendering ``ReportData``: HTML from Jinja2 templates (loopeval's own live in ``reports/``),
the figures inline and beside the report, and LaTeX tables with ``latex=True``."""

from __future__ import annotations

import os
from pathlib import Path

from loopeval.common.paths import reports_path
from loopeval.analysis.report import figures, latex, training
from loopeval.analysis.report.data import ReportData
from loopeval.analysis.stats.display import points, pvalue


def check_output(path: str | Path, what: str = "--out") -> Path:
    """Refuse, before any work, an output file that cannot be written: a folder, a path
    under a file, or an unwritable folder."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path}: is a folder; give a file name such as {path / 'report.html'}")
    parent = path.parent
    for above in (parent, *parent.parents):
        if above.exists():
            if not above.is_dir():
                raise ValueError(f"{what} {path}: {above} is a file, not a folder")
            if not os.access(above, os.W_OK):
                raise ValueError(f"{what} {path}: {above} is not writable")
            break
    return path


def _environment(template: Path):
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    folders = [str(reports_path())]
    if template.parent != Path("."):
        folders.insert(0, str(template.parent.resolve()))
    env = Environment(
        loader=FileSystemLoader(folders),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["points"] = points
    env.filters["signed"] = lambda x: points(x, signed=True)
    env.filters["pvalue"] = pvalue
    return env


def _figures(data: ReportData) -> dict:
    """Every figure of the report, drawn: ``cost`` always, ``training`` with training curves."""
    kind = next(iter(data.kinds), None)
    drawn = {"cost": figures.draw_cost(data.figure, cost=data.cost_mode, wall_clock=data.wall_clock is not None,
                                       unit=data.kind_unit(kind), direction="lower is better" not in (kind or ""))}
    if data.training:
        drawn["training"] = training.draw(data.training)
    return drawn


def render(data: ReportData, template: str | Path = "report.html.j2") -> str:
    """Render ``data`` with a Jinja2 template: a name in loopeval's ``reports/`` folder or a
    path to your own. Autoescaping is on; ``points``, ``signed`` and ``pvalue`` format
    numbers, and ``figures.cost`` is the accuracy-against-cost figure as inline SVG."""
    from jinja2 import TemplateError
    from markupsafe import Markup

    template = Path(template)
    drawn = {name: Markup(figures.svg(fig)) for name, fig in _figures(data).items()}
    try:
        return _environment(template).get_template(template.name).render(data=data, figures=drawn)
    except TemplateError as exc:
        raise ValueError(f"template {template}: {type(exc).__name__}: {exc}") from None


def write_report(data: ReportData, path: str | Path, *, template: str | Path = "report.html.j2",
                 latex_tables: bool = False) -> Path:
    """Render ``data`` into one self-contained HTML file, each figure beside it as
    ``<name>_cost.pdf`` and ``.png`` (and ``<name>_training.*``), and with ``latex_tables``
    every table as ``<name>_tables.tex`` (booktabs)."""
    path = check_output(path)
    html = render(data, template)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    for name, fig in _figures(data).items():
        figures.save(fig, path.with_name(f"{path.stem}_{name}"))
    if latex_tables:
        path.with_name(f"{path.stem}_tables.tex").write_text(latex.tables(data), encoding="utf-8")
    return path
