"""The report's tables as LaTeX (booktabs), for pasting into a paper. Numbers as in the
HTML report: accuracies in points, a continuous metric in its own unit (named in the
row); ‡ marks a comparison decided by exact McNemar (training-free)."""

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


def _unit(c) -> str:
    """A comparison's unit where it is not points: ``' (nats per byte, lower is better)'``."""
    return "" if c.unit.fraction else " (" + _tex(c.kind) + ")"


def _pair(c) -> str:
    return f"{c.show(c.baseline_accuracy)} $\\to$ {c.show(c.candidate_accuracy)}"


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
              f"{_pair(c.param.macro)}{_unit(c.param.macro)} ({_p(c.param.macro.pvalue_decisive)})"] for c in data.conditions]
    out = [_table("Equal parameters: macro score (accuracy in \\%, a continuous metric in its unit), twin $\\to$ "
                  "looped, at the default budget. "
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
                         f"{_pair(m)}{_unit(m)} (Holm {_p(f.pvalue_holm)})"])
    out.append(_table(f"Equal FLOPs: the best cheaper unlooped evaluation $\\to$ looped; realised costs are "
                      f"{'layer passes x generated tokens' if data.cost_mode == 'passes' else 'FLOPs'} relative to "
                      "the plain twin, "
                      "Holm over the budgets.", "delta-flop", "llclcl",
                      ["Decoding", "Looped", "Cost", "Comparator", "Cost", r"Unlooped $\to$ looped"], flop))
    decoding = [[_tex(r["setting"]), *(data.show(t, r["accuracy"][t]) for t in data.tasks),
                 *(data.kind_unit(k).show(r["macros"][k]) for k in data.kinds),
                 " / ".join("--" if r["finished"][t] is None else points(r["finished"][t], digits=0) for t in data.tasks),
                 " / ".join("--" if r["answered"][t] is None else points(r["answered"][t], digits=0) for t in data.tasks),
                 "--" if r["cost"].get(data.cost_mode) is None else f"{r['cost'][data.cost_mode]:.2f}"]
                for r in data.decoding]
    columns = [f"{_tex(t)}" + ("" if data.units[t].fraction else f" ({_tex(data.units[t].name)})") for t in data.tasks]
    columns += ["Macro" + ("" if data.kind_unit(k).fraction else f" ({_tex(k)})") for k in data.kinds]
    out.append(_table("Decoding rules at the default budget: score (accuracy in \\%, a continuous metric in its "
                      "unit), responses that ended by EOS or a stop (\\%), responses that gave a scored answer (\\%) "
                      "and realised cost.",
                      "decoding", "l" + "c" * (len(data.tasks) + len(data.kinds) + 3),
                      ["Setting", *columns, "Ended", "Answered", "Cost"], decoding))
    bench = [[_tex(c.label), _tex(task) + _unit(r), _pair(r), _tex(r.interval()), pvalue(r.pvalue_holm), _tex(r.equivalence)]
             for c in data.conditions for task, r in c.param.tasks.items()]
    out.append(_table("Per benchmark: twin $\\to$ looped (accuracy in \\%, a continuous metric in its unit), 95\\% "
                      "paired-bootstrap interval, $p$ Holm-adjusted over the benchmarks, equivalence within the "
                      "metric's margin (A.5's $\\pm 2$ points for accuracies).", "per-benchmark", "llcccc",
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
