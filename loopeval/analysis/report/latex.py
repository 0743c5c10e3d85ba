"""The report's tables as LaTeX (booktabs), for pasting into a paper. Numbers in points,
as in the HTML report; ‡ marks a comparison decided by exact McNemar (training-free)."""

from __future__ import annotations

from loopeval.analysis.report.data import ReportData
from loopeval.analysis.stats.display import points, pvalue

_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(text) -> str:
    return "".join(_SPECIAL.get(ch, ch) for ch in str(text)).replace("×", r"$\times$").replace("→", r"$\to$")


def _p(p) -> str:
    text = pvalue(p)
    return f"$p{text}$" if text.startswith("<") else f"$p={text}$"


def _ci(ci) -> str:
    return f"[{points(ci.low, signed=True)}, {points(ci.high, signed=True)}]"


def _table(caption: str, label: str, columns: str, header: list[str], rows: list[list[str]]) -> str:
    body = "\n".join("  " + " & ".join(row) + r" \\" for row in rows)
    return "\n".join([
        r"\begin{table}[t]", r"\centering", rf"\caption{{{caption}}}", rf"\label{{tab:{label}}}",
        rf"\begin{{tabular}}{{{columns}}}", r"\toprule", "  " + " & ".join(header) + r" \\", r"\midrule",
        body, r"\bottomrule", r"\end{tabular}", r"\end{table}", "",
    ])


def tables(data: ReportData) -> str:
    """Every table of the report, one ``table`` environment each (needs ``\\usepackage{booktabs}``)."""
    passes = f"$c = {data.multiplier:.2f}$"
    param = [[_tex(c.label) + (r"\textsuperscript{\ddag}" if c.param.test == "mcnemar" else ""), passes,
              str(c.param.seeds) if c.param.seeds else str(c.seeds),
              f"{points(c.param.macro.baseline_accuracy)} $\\to$ {points(c.param.macro.candidate_accuracy)} "
              f"({_p(c.param.macro.pvalue_decisive)})"] for c in data.conditions]
    out = [_table("Equal parameters: macro accuracy (\\%), twin $\\to$ looped, at the default budget. "
                  "\\ddag: exact McNemar test (training-free loop).", "delta-param", "lccl",
                  ["Decoding", "Nominal cost", "Seeds (favouring)", r"Twin $\to$ looped"], param)]
    flop = []
    for c in data.conditions:
        for row in c.flop_rows:
            f = row.result
            if f.comparison is None:
                flop.append([_tex(c.label), _tex(f.loop), f"{row.loop_cost:.2f}", "none cheaper", "--", "--"])
                continue
            m = f.comparison.macro
            flop.append([_tex(c.label), _tex(f.loop), f"{row.loop_cost:.2f}", _tex(f.comparator),
                         f"{row.comparator_cost:.2f}",
                         f"{points(m.baseline_accuracy)} $\\to$ {points(m.candidate_accuracy)} (Holm {_p(f.pvalue_holm)})"])
    out.append(_table(f"Equal FLOPs: the best cheaper unlooped evaluation $\\to$ looped; realised costs are "
                      f"{'layer passes x generated tokens' if data.cost_mode == 'passes' else 'FLOPs'} relative to "
                      "the plain twin, "
                      "Holm over the budgets.", "delta-flop", "llclcl",
                      ["Decoding", "Looped", "Cost", "Comparator", "Cost", r"Unlooped $\to$ looped"], flop))
    decoding = [[_tex(r["setting"]), *(points(r["accuracy"][t]) for t in data.tasks), points(r["macro"]),
                 " / ".join("--" if r["finished"][t] is None else points(r["finished"][t], digits=0) for t in data.tasks),
                 " / ".join("--" if r["answered"][t] is None else points(r["answered"][t], digits=0) for t in data.tasks),
                 "--" if r["cost"].get(data.cost_mode) is None else f"{r['cost'][data.cost_mode]:.2f}"]
                for r in data.decoding]
    out.append(_table("Decoding rules at the default budget: accuracy (\\%), responses that ended by EOS or a "
                      "stop (\\%), responses that gave a scored answer (\\%) and realised cost.",
                      "decoding", "l" + "c" * (len(data.tasks) + 4),
                      ["Setting", *map(_tex, data.tasks), "Macro", "Ended", "Answered", "Cost"], decoding))
    bench = [[_tex(c.label), _tex(task), f"{points(r.baseline_accuracy)} $\\to$ {points(r.candidate_accuracy)}",
              _ci(r.ci), pvalue(r.pvalue_holm), "yes" if r.equivalent else "no"]
             for c in data.conditions for task, r in c.param.tasks.items()]
    out.append(_table("Per benchmark: twin $\\to$ looped (\\%), 95\\% paired-bootstrap interval, $p$ Holm-adjusted "
                      f"over the benchmarks, equivalence within $\\pm {points(data.conditions[0].param.margin)}$ points.", "per-benchmark", "llcccc",
                      ["Decoding", "Benchmark", r"Twin $\to$ looped", "95\\% CI", r"$p_{\mathrm{Holm}}$", "Equivalent"],
                      bench))
    if data.ceiling is not None:
        x = data.ceiling
        out.append(_table("The ceiling (Eq. 4): the gain the loop's compute would buy at the rate parameters do, "
                          "against the $\\Delta_{\\mathrm{param}}$ interval.", "ceiling", "cccc",
                          ["$c$", "Size gap (points)", r"$\Delta^\star$", r"$\Delta_{\mathrm{param}}$ (95\% CI)"],
                          [[f"{x.c:.2f}", points(x.accuracy_large - x.accuracy_small, signed=True),
                            points(x.delta_star, signed=True), _ci(x.param.macro.ci)]]))
    text = "\n".join(out)
    if data.pilot:  # every table says it is a pilot's
        text = text.replace("\\caption{", f"\\caption{{{_tex(data.pilot[0].upper() + data.pilot[1:])}, not final. ")
    return text
