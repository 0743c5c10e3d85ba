"""Rendering ``ReportData`` with Jinja2 templates (loopeval's own live in ``reports/``)."""

from __future__ import annotations

from pathlib import Path

from loopeval.paths import reports_path
from loopeval.report.data import ReportData
from loopeval.stats.display import points, pvalue


def render(data: ReportData, template: str | Path = "report.html.j2") -> str:
    """Render ``data`` with a Jinja2 template: a name in loopeval's ``reports/`` folder
    or a path to your own. Autoescaping is on; ``points`` and ``pvalue`` format numbers."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    template = Path(template)
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
    return env.get_template(template.name).render(data=data)


def write_report(data: ReportData, path: str | Path, *, template: str | Path = "report.html.j2") -> Path:
    """Render ``data`` and write one self-contained HTML file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(data, template), encoding="utf-8")
    return path
