"""``loopeval report``."""

from __future__ import annotations

import sys

from loopeval.cli._common import (MARGIN_HELP, add_metric_option, add_reading_options, add_stat_options, keyed_values,
                                  metric_option)


def add(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write the two-test HTML report from lm-eval runs of a looped model and its twin",
        description="Runs are lm-eval --output_path folders made with --model looped and trace=; each run's loop, "
        "budget scale and decoding rules are read from its trace, its training seed and variant from the "
        "training_manifest.json beside its checkpoint (or --seed / --variant). Give one run per budget, decoding "
        "rule, training variant and seed.",
    )
    p.add_argument("--twin", nargs="+", required=True, metavar="RUN", help="the unlooped twin's evaluations")
    p.add_argument("--looped", nargs="+", required=True, metavar="RUN", help="the looped model's evaluations")
    p.add_argument("--larger", metavar="RUN", help="a larger unlooped model: a comparator that may cost more")
    p.add_argument("--sizes", nargs=2, type=float, metavar=("SMALL", "LARGE"),
                   help="parameter counts of the twin and the larger model, for the ceiling of Eq. 4 (Table 5)")
    p.add_argument("--seed", action="append", default=[], metavar="RUN=N", dest="seeds",
                   help="the training seed of a run without a manifest (repeatable)")
    p.add_argument("--variant", action="append", default=[], metavar="RUN=LABEL", dest="variants",
                   help="the training variant of a run, e.g. runs/twin_3x=3x-FT (repeatable)")
    p.add_argument("--training", nargs=2, action="append", default=[], metavar=("TWIN", "LOOPED"),
                   help="checkpoints of a twin pair whose manifests hold held-out curves (Fig. 3 and 5; repeatable)")
    p.add_argument("--serve-cost", nargs="+", default=[], metavar="DIR",
                   help="loopeval serve-cost output folders: adds the serving section (Table 10)")
    p.add_argument("--wall-clock", action="store_true",
                   help="Figure 2 on measured time: looped points at the --serve-cost latency ratio instead of c")
    p.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    p.add_argument("--template", default="report.html.j2", help="a Jinja2 template (default: loopeval's own)")
    p.add_argument("--json", metavar="FILE", help="also write the report data as JSON")
    p.add_argument("--latex", action="store_true", help="also write every table as LaTeX (booktabs) beside the report")
    p.add_argument("--title")
    p.add_argument("--default-scale", type=float, default=1.0, help="the budget scale of the Δparam test (default 1)")
    add_stat_options(p, "cost", "selection", "alpha", "n_resamples", "seed", flags={"seed": "--bootstrap-seed"})
    add_metric_option(p, "--margin", MARGIN_HELP)
    p.add_argument("--strict", action="store_true", help="fail instead of warning when a fairness check fails")
    p.add_argument("--intended", nargs="+", default=[], metavar="NAME",
                   help="differences between the sides that are intended (a setting such as chat_template_sha, or "
                   "prompts, generation_kwargs, task_version): a failed check on them does not withhold the verdict")
    add_reading_options(p)
    p.set_defaults(func=run)


def _assignments(pairs: list[str], flag: str, convert) -> dict[str, object]:
    """``RUN=VALUE`` pairs of a repeatable flag, one per run (:func:`keyed_values`)."""
    split = []
    for pair in pairs:
        run, sep, value = pair.rpartition("=")
        if not sep or not run:
            raise ValueError(f"{flag} {pair!r}: expected RUN=VALUE")
        split.append((run, convert(flag, value)))
    return keyed_values(split, flag, lambda run: f"run {run}")


def run(args) -> int:
    from pathlib import Path

    from loopeval.common.args import as_int, as_text
    from loopeval.common.outputs import check_outputs
    from loopeval.common.paths import reports_path
    from loopeval.analysis.report import RunSpec, build_report, check_output, write_report
    from loopeval.evaluation.identity import check_intended

    out = check_output(args.out)  # before any work
    if args.json:
        check_output(args.json, "--json")
    check_outputs({"--out": args.out, "--json": args.json},
                  [*args.twin, *args.looped, args.larger, *args.serve_cost, args.template,
                   *(p for pair in args.training for p in pair)])
    template = Path(args.template)
    if not (template.is_file() or (reports_path() / template.name).is_file()):
        raise ValueError(f"--template {args.template}: no such template file")
    seeds = _assignments(args.seeds, "--seed", as_int)
    variants = _assignments(args.variants, "--variant", as_text)
    given = set(args.twin) | set(args.looped) | ({args.larger} if args.larger else set())
    stray = sorted((set(seeds) | set(variants)) - given)
    if stray:
        raise ValueError(f"--seed/--variant name {', '.join(stray)}, which is not among the runs given")

    def spec(run: str) -> RunSpec:
        return RunSpec(run, seed=seeds.get(run), variant=variants.get(run))

    check_intended(args.intended)
    margin, margins = metric_option(args, "--margin")
    data = build_report(
        [spec(r) for r in args.twin], [spec(r) for r in args.looped], larger=spec(args.larger) if args.larger else None,
        sizes=tuple(args.sizes) if args.sizes else None, default_scale=args.default_scale, cost=args.cost,
        selection=args.selection, alpha=args.alpha, margin=margin,
        margins=margins, training_pairs=[tuple(pair) for pair in args.training],
        serve_cost=args.serve_cost, wall_clock=args.wall_clock, title=args.title,
        strict=args.strict, n_resamples=args.n_resamples, seed=args.seed,
        allow_subset=args.allow_subset, unfinished_fallback=args.unfinished_fallback,
        intended_differences=tuple(args.intended),
    )
    path = write_report(data, out, template=args.template, latex_tables=args.latex)
    if args.json:
        Path(args.json).write_text(data.to_json())
    for cond in data.conditions:
        for sentence in cond.verdict.sentences:
            print(f"[{cond.label}] {sentence}")
    for check in data.failed_checks:
        print(f"FAILED CHECK {check.name}: {check.detail}", file=sys.stderr)
    print(f"wrote {path}")
    return 0
