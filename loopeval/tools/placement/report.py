"""A placement search for people: the ranked terminal table and ``placement.html``
with its location-profile figure (matplotlib, inline SVG)."""

from __future__ import annotations

import html
import io
from pathlib import Path

from loopeval.tools.placement.results import SETTINGS_NAME, Correlation, PlacementRow

COLUMNS = ("rank", "loop", "operator", "beta", "K", "width", "start", "passes", "cost", "PPL", "PPL_T", "PPL_T 95% CI",
           "T*", "KL", "PPL_T vs unlooped [95% CI]", "distinct")


def _change(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.2f}"


def _cells(rank: str, r: PlacementRow, base: PlacementRow) -> list[str]:
    dash = "-"
    ci = dash if r.ppl_t_ci is None else f"[{r.ppl_t_ci[0]:.4g}, {r.ppl_t_ci[1]:.4g}]"
    if r is base:
        change = distinct = dash
    else:
        change = _change(r.ppl_t / base.ppl_t) + "%"
        if r.ratio_ci is not None:
            change += f" [{_change(r.ratio_ci[0])}, {_change(r.ratio_ci[1])}]"
        distinct = dash if r.distinguishable is None else ("yes" if r.distinguishable else "no")
    return [rank, r.loop or "unlooped", r.operator or dash, dash if r.beta is None else f"{r.beta:g}",
            dash if r.times is None else str(r.times), dash if r.width is None else str(r.width),
            dash if r.start is None else str(r.start), f"{r.passes:g}", f"{r.multiplier:.3f}x", f"{r.ppl:.4g}",
            f"{r.ppl_t:.4g}", ci, f"{r.temperature:.3g}", f"{r.kl:.4g}", change, distinct]


def table_rows(result, top: int | None = None) -> list[list[str]]:
    base = result.unlooped
    best = result.ranked()[:top] if top else result.ranked()
    return [_cells("-", base, base)] + [_cells(str(i), r, base) for i, r in enumerate(best, 1)]


def noise_summary(result) -> str:
    """Which candidates the test text can tell from the unlooped model, and how the intervals were made."""
    looped = result.ranked()
    known = [r for r in looped if r.distinguishable is not None]
    if not known:
        from loopeval.tools.placement.noise import MIN_TEST_DOCUMENTS

        documents = looped[0].test_documents if looped else None
        if documents is not None and documents < MIN_TEST_DOCUMENTS:
            return (f"(no candidate is called distinguishable: the bootstrap runs over only {documents} test "
                    f"document(s), fewer than {MIN_TEST_DOCUMENTS}; give more text, e.g. a larger --max-tokens)")
        return "(no confidence intervals: these rows were written before place recorded them)"
    better = sum(r.distinguishable and r.ppl_t < result.unlooped.ppl_t for r in known)
    worse = sum(r.distinguishable and r.ppl_t > result.unlooped.ppl_t for r in known)
    documents = known[0].test_documents
    return (f"{better} candidate(s) have a PPL_T distinguishably below the unlooped model's, {worse} above, "
            f"{len(known) - better - worse} are not distinguishable (\"distinct\": the 95% interval of PPL_T / "
            f"unlooped PPL_T excludes 1; bootstrap over {documents} test documents, {result.unlooped.tokens} tokens; "
            f"per candidate, not adjusted for the {len(known)} comparisons)")


def format_table(result, top: int | None = 20) -> str:
    """The unlooped model, then the best ``top`` candidates by ``result.rank_by``, and the noise summary."""
    rows = [list(COLUMNS)] + table_rows(result, top)
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) if i == 1 or i == 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    n = len(result.ranked())
    lines.append(f"(ranked by {result.rank_by}; {min(top or n, n)} of {n} candidates shown)")
    lines.append(noise_summary(result))
    return "\n".join(lines)


def handoff(result, model: str) -> str:
    """The best candidate as the commands that evaluate and serve exactly that loop
    (spec, operator and beta), for the checkpoint ``model``."""
    best = next(iter(result.ranked()), None)
    if best is None:
        return "no candidate scored"
    beta = "" if best.operator == "repeat" else f",loop_beta={best.beta:g}"
    serve_beta = "" if best.operator == "repeat" else f" --beta {best.beta:g}"
    return "\n".join([
        f"best by {result.rank_by}: {best.loop} ({best.operator}, beta {best.beta:g}); its loop_config.json is "
        f"{result.out / 'loop_config.json'}",
        f"  lm_eval --model looped --model_args pretrained={model},loop={best.loop},loop_operator={best.operator}{beta}",
        f"  loopeval serve-cost --model {model} --loop {best.loop} --operator {best.operator}{serve_beta} --out serve",
    ])


def format_correlations(correlations: list[Correlation]) -> str:
    return "\n".join(f"Spearman rho(accuracy, -{c.metric}) = {c.statistic:+.3f} (p = {c.pvalue:.3g}, n = {c.n})"
                     for c in correlations)


CLIP = 1.25
"""The profile's axis ends at +25% PPL_T over the unlooped model; windows above it (a loop
at layer 0 can reach 50x) are drawn on the edge as open triangles and counted in the caption."""


def profile_lines(result) -> dict[tuple[int, int], dict[int, float]]:
    """``{(width, K): {start: PPL_T / unlooped PPL_T}}`` at each start's best anchor beta."""
    best: dict[tuple[int, int], dict[int, float]] = {}
    for r in result.rows:
        if r.loop is None or r.mlp_loop:
            continue
        line = best.setdefault((r.width, r.times), {})
        line[r.start] = min(line.get(r.start, float("inf")), r.ppl_t / result.unlooped.ppl_t)
    return best


def location_profile_svg(result) -> str:
    """PPL_T relative to the unlooped model (in %) against window start, one line per
    (width, K) at its best anchor beta (paper D.1, Figure 6 left). The axis is clipped at
    ``CLIP`` so catastrophic windows do not flatten the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = profile_lines(result)
    widths = sorted({w for w, _ in best})
    styles = {k: s for k, s in zip(sorted({k for _, k in best}), ["-", "--", ":", "-."] * 4)}
    cmap = plt.get_cmap("viridis")
    values = [v for line in best.values() for v in line.values()]
    inside = [v for v in values if v <= CLIP] or [1.0]
    low, high = min(min(inside), 1.0), max(max(inside), 1.0)
    pad = max(0.002, 0.06 * (high - low))
    top = (high + pad - 1) * 100
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (w, k), line in sorted(best.items()):
        starts = sorted(line)
        colour = cmap(widths.index(w) / max(1, len(widths) - 1))
        shown = [min((line[s] - 1) * 100, top) for s in starts]
        ax.plot(starts, shown, styles[k], color=colour, marker=".", lw=1.2, label=f"w={w}, K={k}")
        off = [s for s in starts if line[s] > CLIP]
        if off:
            ax.plot(off, [top] * len(off), "^", color=colour, mfc="none", ms=7, clip_on=False)
    ax.axhline(0.0, color="black", lw=1, label="unlooped")
    worst = max(values, default=1.0)
    clipped = sum(v > CLIP for v in values)
    ax.set_ylim((low - pad - 1) * 100, top)
    ax.set_xlabel("window start (layer)")
    ax.set_ylabel("PPL$_T$ vs unlooped (%)")
    if clipped:
        ax.set_title(f"{clipped} point(s) above +{(CLIP - 1) * 100:.0f}% shown as \u25b3 on the edge "
                     f"(worst: {worst:.3g}x the unlooped PPL$_T$)", fontsize=8)
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
(temperature fitting) and {test_tokens} test tokens (scoring), whole documents split to balance tokens.
PPL<sub>T</sub> is the test perplexity at the candidate's own temperature T*, fitted on the validation tokens;
KL is the mean KL(unlooped &#8214; candidate) per test token. Ranked by <b>{rank_by}</b>, lower is better.</p>
<p>{noise}</p>
<figure>{svg}<figcaption>Location profile: PPL<sub>T</sub> relative to the unlooped model (the black line at 0%)
against the window's first layer, one line per (width, K), each point at its best anchor &beta;. The axis stops
at +{clip:.0f}%; points above it are open triangles on the edge.</figcaption></figure>
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
        svg=location_profile_svg(result), correlations=corr, noise=html.escape(noise_summary(result)),
        clip=(CLIP - 1) * 100,
        head="".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS), body=body,
    )
    path.write_text(page, encoding="utf-8")
    return path
