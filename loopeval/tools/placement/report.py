"""A placement search for people: the ranked terminal table and ``placement.html``
with its location-profile figure (matplotlib, inline SVG)."""

from __future__ import annotations

import html
import io
from pathlib import Path

from loopeval.tools.placement.results import SETTINGS_NAME, Correlation, PlacementRow

COLUMNS = ("rank", "loop", "operator", "beta", "K", "width", "start", "passes", "cost", "PPL", "PPL_T", "T*", "KL",
           "PPL_T vs unlooped")


def _cells(rank: str, r: PlacementRow, base: PlacementRow) -> list[str]:
    change = "" if r is base else f"{(r.ppl_t / base.ppl_t - 1) * 100:+.1f}%"
    dash = "-"
    return [rank, r.loop or "unlooped", r.operator or dash, dash if r.beta is None else f"{r.beta:g}",
            dash if r.times is None else str(r.times), dash if r.width is None else str(r.width),
            dash if r.start is None else str(r.start), f"{r.passes:g}", f"{r.multiplier:.3f}x", f"{r.ppl:.4g}",
            f"{r.ppl_t:.4g}", f"{r.temperature:.3g}", f"{r.kl:.4g}", change]


def table_rows(result, top: int | None = None) -> list[list[str]]:
    base = result.unlooped
    best = result.ranked()[:top] if top else result.ranked()
    return [_cells("-", base, base)] + [_cells(str(i), r, base) for i, r in enumerate(best, 1)]


def format_table(result, top: int | None = 20) -> str:
    """The unlooped model, then the best ``top`` candidates by ``result.rank_by``."""
    rows = [list(COLUMNS)] + table_rows(result, top)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) if i == 1 or i == 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    n = len(result.ranked())
    lines.append(f"(ranked by {result.rank_by}; {min(top or n, n)} of {n} candidates shown)")
    return "\n".join(lines)


def format_correlations(correlations: list[Correlation]) -> str:
    return "\n".join(f"Spearman rho(accuracy, -{c.metric}) = {c.statistic:+.3f} (p = {c.pvalue:.3g}, n = {c.n})"
                     for c in correlations)


def location_profile_svg(result) -> str:
    """PPL_T against window start, one line per (width, K) at its best anchor beta, with
    the unlooped model's PPL_T as a reference line (paper D.1, Figure 6 left)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best: dict[tuple[int, int], dict[int, float]] = {}
    for r in result.rows:
        if r.loop is None or r.mlp_loop:
            continue
        line = best.setdefault((r.width, r.times), {})
        line[r.start] = min(line.get(r.start, float("inf")), r.ppl_t)
    widths = sorted({w for w, _ in best})
    styles = {k: s for k, s in zip(sorted({k for _, k in best}), ["-", "--", ":", "-."] * 4)}
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (w, k), line in sorted(best.items()):
        starts = sorted(line)
        colour = cmap(widths.index(w) / max(1, len(widths) - 1))
        ax.plot(starts, [line[s] for s in starts], styles[k], color=colour, marker=".", lw=1.2, label=f"w={w}, K={k}")
    ax.axhline(result.unlooped.ppl_t, color="black", lw=1, label="unlooped")
    ax.set_xlabel("window start (layer)")
    ax.set_ylabel("PPL$_T$ (test, at the fitted T*)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left", frameon=False)
    fig.tight_layout()
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "loopeval"}):  # the same page for the same rows
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Loop placement: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
th, td {{ padding: 0.2em 0.6em; text-align: right; border-bottom: 1px solid #ddd; }}
td:nth-child(2), td:nth-child(3), th:nth-child(2), th:nth-child(3) {{ text-align: left; }}
tr.base {{ background: #f1f1f1; font-weight: 600; }}
figure {{ margin: 1em 0; }} figcaption {{ font-size: 0.85em; color: #555; max-width: 60em; }}
</style></head><body>
<h1>Where to put the loop</h1>
<p>Model <code>{model}</code>, {n} candidates scored on <code>{data}</code>: {val_tokens} validation tokens
(temperature fitting) and {test_tokens} test tokens (scoring), split by document hash.
PPL<sub>T</sub> is the test perplexity at the candidate's own temperature T*, fitted on the validation tokens;
KL is the mean KL(unlooped &#8214; candidate) per test token. Ranked by <b>{rank_by}</b>, lower is better.</p>
<figure>{svg}<figcaption>Location profile: PPL<sub>T</sub> against the window's first layer, one line per
(width, K), each point at its best anchor &beta;; the black line is the unlooped model.</figcaption></figure>
{correlations}
<table><thead><tr>{head}</tr></thead><tbody>
{body}
</tbody></table>
</body></html>
"""


def write_html(result, path: str | Path, correlations: list[Correlation] | None = None) -> Path:
    """A self-contained page: the figure inline as SVG and every candidate, ranked."""
    import json

    path = Path(path)
    settings_file = result.out / SETTINGS_NAME
    settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
    rows = table_rows(result)
    body = "\n".join(
        ("<tr class='base'>" if i == 0 else "<tr>") + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
        for i, row in enumerate(rows)
    )
    corr = ""
    if correlations:
        corr = "<p>" + "<br>".join(html.escape(line) for line in format_correlations(correlations).splitlines()) + "</p>"
    page = _PAGE.format(
        title=html.escape(str(settings.get("model", ""))), model=html.escape(str(settings.get("model", ""))),
        data=html.escape(str(settings.get("data", ""))), n=len(rows) - 1,
        val_tokens=result.unlooped.tokens_val, test_tokens=result.unlooped.tokens, rank_by=html.escape(result.rank_by),
        svg=location_profile_svg(result), correlations=corr,
        head="".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS), body=body,
    )
    path.write_text(page, encoding="utf-8")
    return path
