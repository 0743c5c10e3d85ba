"""The ``loopeval`` command line. Each subcommand is an ``_add_<name>`` function that
registers its parser and binds ``func``; heavy imports happen inside the handlers."""

from __future__ import annotations

import argparse
import sys


def _add_check_cache(sub) -> None:
    p = sub.add_parser(
        "check-cache",
        help="compare cached greedy decoding of a (looped) model with full recomputation",
        description="Exit status 0 when cached decoding equals full recomputation, 1 on a mismatch.",
    )
    p.add_argument("--model", help="checkpoint path or hub id (default: a tiny random Qwen3 built on the fly)")
    p.add_argument("--loop", help="loop spec such as 8:16x2 (default: the checkpoint's own loop, if any)")
    p.add_argument("--operator", default=None, choices=["repeat", "damped"])
    p.add_argument("--beta", type=float, default=None)
    p.add_argument("--mix", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable); default: three built-in prompts")
    p.set_defaults(func=_check_cache)


def _check_cache(args) -> int:
    from loopeval.cache_check import run_check_cache_cli

    return run_check_cache_cli(args)


def _add_tasks_path(sub) -> None:
    p = sub.add_parser("tasks-path", help="print the folder to pass to lm_eval --include_path")
    p.set_defaults(func=_tasks_path)


def _tasks_path(args) -> int:
    from loopeval.paths import tasks_path

    print(tasks_path())
    return 0


def _add_compare(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="paired statistics of two lm-eval runs: bootstrap, McNemar, TOST",
        description=(
            "Compare CANDIDATE with BASELINE item by item, per task and on the macro (unweighted mean over "
            "leaf tasks): accuracies, difference in points, paired-bootstrap 95%% interval and two-sided p, "
            "exact McNemar p on 0/1 tasks, and TOST equivalence (90%% interval inside +-2 points). A run is an "
            "lm-eval --output_path folder, its model folder or a results_*.json file written with --log_samples. "
            "Exit status 2, with the reason on stderr, when the runs cannot be paired."
        ),
    )
    p.add_argument("baseline", help="baseline run (e.g. the twin)")
    p.add_argument("candidate", help="candidate run (e.g. the looped model)")
    p.add_argument("--json", action="store_true", help="print one JSON object (fractions, not points)")
    p.add_argument("--metric", help="metric instead of each task's main one, e.g. exact_match,flexible-extract")
    p.add_argument("--tasks", nargs="+", metavar="T", help="leaf tasks or groups to compare (default: all)")
    p.add_argument("--n-resamples", type=int, default=10_000, help="bootstrap resamples (default: 10000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    p.set_defaults(func=_compare)


def _compare(args) -> int:
    import json

    from loopeval.protocol import compare
    from loopeval.runs import decoding_differences, load_run, pair_runs
    from loopeval.stats.display import points, pvalue

    runs = {role: load_run(path, metric=args.metric, tasks=args.tasks)
            for role, path in (("baseline", args.baseline), ("candidate", args.candidate))}
    paired = pair_runs(runs)
    for diff in decoding_differences(runs["baseline"], runs["candidate"]):
        print(f"warning: the runs decode differently: {diff}", file=sys.stderr)
    result = compare(paired, "baseline", "candidate",
                     resampler=paired.resampler(n_resamples=args.n_resamples, seed=args.seed))
    if args.json:
        print(json.dumps({
            "tasks": {t: c.as_dict() for t, c in result.tasks.items()},
            "macro": result.macro.as_dict(),
            "runs": {role: str(run.path) for role, run in runs.items()},
            "n_resamples": result.n_resamples,
            "seed": result.bootstrap_seed,
        }, indent=2))
        return 0
    for role, run in runs.items():
        print(f"{role:<9}  {run.path}  ({run.name})")
    print(f"paired bootstrap over items, {result.n_resamples} resamples, seed {result.bootstrap_seed}; "
          f"equivalent: 90% interval inside ±{points(result.margin)} points\n")
    header = ("task", "metric", "n", "baseline", "candidate", "delta", "95% CI", "p", "McNemar p", "equivalent")
    lines = [
        (name, runs["baseline"].tasks[c.task].metric if c.task else "", str(c.n),
         points(c.baseline_accuracy), points(c.candidate_accuracy), points(c.delta, signed=True),
         f"[{points(c.ci.low, signed=True)}, {points(c.ci.high, signed=True)}]", pvalue(c.pvalue),
         pvalue(c.mcnemar_pvalue), "yes" if c.equivalent else "no")
        for name, c in [*result.tasks.items(), ("macro", result.macro)]
    ]
    widths = [max(len(row[i]) for row in (header, *lines)) for i in range(len(header))]
    for row in (header, *lines):
        print("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))).rstrip())
    if result.seeds:
        print(f"\nseed runs favouring the candidate: {result.seeds}")
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="fine-tune an unlooped twin and a looped model identically",
        description=(
            "Fully fine-tune BASE twice on the same JSONL rows, batches, order, seeds and steps: without the "
            "loop into OUT/twin and with it into OUT/looped (or one of them with --only, for separate jobs). "
            "Each folder is a checkpoint with training_manifest.json. Options left out take TrainConfig's "
            "defaults (docs/training.md). Data-parallel: accelerate launch -m loopeval train ..."
        ),
    )
    p.add_argument("--base", required=True, help="unlooped checkpoint folder or hub id")
    p.add_argument("--data", required=True, help='JSONL of {"prompt", "completion"} and/or {"text"} rows')
    p.add_argument("--loop", help="loop spec of the looped model, e.g. 8:16x2 (required unless --only twin)")
    p.add_argument("--out", required=True, help="output folder; the models go to OUT/twin and OUT/looped")
    p.add_argument("--only", choices=["twin", "looped"], help="train only this one of the two")
    p.add_argument("--operator", default="repeat", choices=["repeat", "damped"])
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--mix", type=float, default=None, help="fixed input-mixing logit (not learned)")
    p.add_argument("--overwrite", action="store_true", help="write into non-empty output folders")
    config = p.add_argument_group("training (TrainConfig)")
    for flag, type_, help_ in [
        ("--steps", int, "optimizer steps"),
        ("--batch-size", int, "global batch, in rows"),
        ("--micro-batch-size", int, "rows per forward on each process"),
        ("--lr", float, "peak learning rate"),
        ("--min-lr-ratio", float, "final learning rate / peak"),
        ("--warmup", int, "linear warm-up steps"),
        ("--weight-decay", float, "AdamW weight decay of matrices and embeddings"),
        ("--grad-clip", float, "gradient-norm clip; 0: off"),
        ("--max-length", int, "tokens per row; longer rows are cut"),
        ("--seed", int, "training seed (dropout)"),
        ("--data-seed", int, "batch-order seed"),
        ("--dtype", str, "weight dtype: float32, bfloat16 or float16"),
        ("--log-every", int, "steps per loss-curve point"),
    ]:
        config.add_argument(flag, type=type_, default=argparse.SUPPRESS, help=help_)
    config.add_argument("--activation-checkpointing", action="store_true", default=argparse.SUPPRESS,
                        help="recompute layer activations in the backward pass to save memory")
    p.set_defaults(func=_train)


def _train(args) -> int:
    from dataclasses import fields
    from pathlib import Path

    from accelerate import PartialState

    from loopeval.manifest import twin_mismatches
    from loopeval.train import LOOPED, TWIN, TrainConfig, train_model, train_twins

    if args.loop is None and args.only != TWIN:
        raise ValueError("--loop is required unless --only twin")
    config = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)})
    loop = dict(operator=args.operator, beta=args.beta, mix=args.mix)
    common = dict(config=config, overwrite=args.overwrite)
    out = Path(args.out)
    if args.only == TWIN:
        results = [train_model(args.base, args.data, out=out / TWIN, **common)]
    elif args.only == LOOPED:
        results = [train_model(args.base, args.data, out=out / LOOPED, loop=args.loop, **loop, **common)]
    else:
        results = list(train_twins(args.base, args.data, loop=args.loop, out=out, **loop, **common))
    if not PartialState().is_main_process:  # one report under data-parallel launchers
        return 0
    for r in results:
        m = r.manifest
        loss = " -> ".join(f"{x:.4f}" for _, x in (m["loss_curve"][0], m["loss_curve"][-1])[:len(m["loss_curve"])])
        print(f"{m['role']:<6}  {r.path}  loss {loss}, {m['tokens']['input']} tokens, "
              f"{m['flops']['train']:.3g} training FLOPs, {m['train_time_s']:.1f} s training")
    data = results[0].manifest["data"]
    if data["rows_truncated"]:
        print(f"{data['rows_truncated']} of {data['rows']} rows were cut to --max-length {config.max_length}")
    if len(results) == 2:
        mismatches = twin_mismatches(results[0].manifest, results[1].manifest)
        print("twins: identical apart from the loop" if not mismatches else "twins DIFFER: " + "; ".join(mismatches))
    return 0


def _int_list(text: str) -> list[int]:
    """``"2-8"``, ``"2,3,4"`` or a mix (``"0-3,6"``)."""
    values = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            values += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers such as 2-8 or 2,3,4") from None
    return values


def _float_list(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers such as 0,0.25,0.5") from None


def _add_place(sub) -> None:
    p = sub.add_parser(
        "place",
        help="score where to put a loop: every window of a grid by calibrated perplexity PPL_T, PPL and KL",
        description=(
            "Score every window of a grid on held-out text (JSONL of {\"text\"} documents, split by hash into a "
            "validation part for temperature fitting and a test part for scoring): PPL_T, plain PPL and the mean KL "
            "to the unlooped model, which is the first row. Writes OUT/placements.jsonl (a re-run skips candidates "
            "already there) and OUT/placement.html, and prints the ranked table."
        ),
    )
    p.add_argument("--model", required=True, help="unlooped checkpoint folder or hub id")
    p.add_argument("--data", required=True, metavar="TEXT.jsonl")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--widths", type=_int_list, default=argparse.SUPPRESS, help="window widths (default 2-8)")
    p.add_argument("--times", type=_int_list, default=argparse.SUPPRESS, help="K, passes of the window (default 2,3,4)")
    p.add_argument("--betas", type=_float_list, default=argparse.SUPPRESS, help="anchors beta (default 0,0.25,0.5)")
    p.add_argument("--starts", type=_int_list, default=argparse.SUPPRESS, help="window starts (default: every layer)")
    p.add_argument("--operator", default=argparse.SUPPRESS, help="repeat or damped (default: damped)")
    p.add_argument("--mlp-loop", nargs="?", type=int, const=10, default=argparse.SUPPRESS, metavar="TOP",
                   help="also try the TOP windows (default 10) with one MLP-only loop (K=3) at their first layer")
    p.add_argument("--max-tokens", type=int, default=argparse.SUPPRESS, help="text tokens to use, in all")
    p.add_argument("--seq-len", type=int, default=argparse.SUPPRESS, help="tokens per row (default 1024)")
    p.add_argument("--val-fraction", type=float, default=argparse.SUPPRESS, help="share of documents for validation (0.5)")
    p.add_argument("--batch-tokens", type=int, default=argparse.SUPPRESS, help="tokens per layer call (default 8192)")
    p.add_argument("--rank-by", default=argparse.SUPPRESS, help="ppl_t (default), ppl or kl")
    p.add_argument("--correlate", metavar="RESULTS.jsonl", default=argparse.SUPPRESS,
                   help='benchmark accuracies, {"loop", "operator", "beta", "accuracy"} rows: Spearman rho per score')
    p.add_argument("--dtype", default=argparse.SUPPRESS, help="weight dtype, e.g. bfloat16 (default: the checkpoint's)")
    p.add_argument("--device", default=argparse.SUPPRESS, help="default: cuda if available, else cpu")
    p.add_argument("--top", type=int, default=20, help="rows of the printed table (default 20)")
    p.set_defaults(func=_place)


def _place(args) -> int:
    from loopeval.placement import place
    from loopeval.placement.report import format_correlations, format_table

    options = {k: v for k, v in vars(args).items() if k not in ("command", "func", "model", "data", "out", "top")}
    if "correlate" in options:
        options["results"] = options.pop("correlate")
    result = place(args.model, args.data, out=args.out, **options)
    print(format_table(result, top=args.top))
    if result.correlations:
        print(format_correlations(list(result.correlations)))
    print(f"{result.scored} candidates scored in {result.wall_s:.1f} s ({result.layer_passes:.1f} layer passes per "
          f"text position); wrote {result.out / 'placements.jsonl'} and {result.out / 'placement.html'}")
    return 0


# Subcommands are listed here in the order `loopeval --help` shows them.
def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="write the two-test HTML report from lm-eval runs of a looped model and its twin",
        description="Runs are lm-eval --output_path folders made with --model looped and trace=; each run's loop, "
        "budget scale and decoding rules are read from its trace. Give one run per budget (and per training seed).",
    )
    p.add_argument("--twin", nargs="+", required=True, metavar="RUN", help="the unlooped twin's evaluations")
    p.add_argument("--looped", nargs="+", required=True, metavar="RUN", help="the looped model's evaluations")
    p.add_argument("--larger", metavar="RUN", help="a larger unlooped model, a further equal-FLOPs comparator")
    p.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    p.add_argument("--template", default="report.html.j2", help="a Jinja2 template (default: loopeval's own)")
    p.add_argument("--json", metavar="FILE", help="also write the report data as JSON")
    p.add_argument("--title")
    p.add_argument("--default-scale", type=float, default=1.0, help="the budget scale of the Δparam test (default 1)")
    p.add_argument("--n-resamples", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strict", action="store_true", help="fail instead of warning when a fairness check fails")
    p.set_defaults(func=_report)


def _report(args) -> int:
    from pathlib import Path

    from loopeval.report import build_report, write_report

    data = build_report(
        args.twin, args.looped, larger=args.larger, default_scale=args.default_scale, title=args.title,
        strict=args.strict, n_resamples=args.n_resamples, seed=args.seed,
    )
    path = write_report(data, args.out, template=args.template)
    if args.json:
        Path(args.json).write_text(data.to_json())
    for cond in data.conditions:
        for sentence in cond.verdict.sentences:
            print(f"[{cond.label}] {sentence}")
    for check in data.failed_checks:
        print(f"FAILED CHECK {check.name}: {check.detail}", file=sys.stderr)
    print(f"wrote {path}")
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="the protocol end to end on tiny local models: data, twin training, 16 lm-eval runs, report",
        description="Makes a synthetic arithmetic task, trains a tiny twin and looped model on CPU, evaluates both "
        "through lm-eval's looped model at 0.5-2x budgets with and without budget forcing, and writes the report.",
    )
    p.add_argument("--out", default="loopeval-demo", help="output folder (default: ./loopeval-demo)")
    p.add_argument("--size", default="default", choices=["default", "tiny"], help="tiny: a one-minute smoke test")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)


def _demo(args) -> int:
    from loopeval.demo import run_demo

    run_demo(args.out, size=args.size, seed=args.seed)
    return 0


_SUBCOMMANDS = [_add_demo, _add_check_cache, _add_place, _add_train, _add_compare, _add_report, _add_tasks_path]


def build_parser() -> argparse.ArgumentParser:
    from loopeval import __version__

    parser = argparse.ArgumentParser(
        prog="loopeval",
        description="Does looping a trained language model pay for its inference compute?",
    )
    parser.add_argument("--version", action="version", version=f"loopeval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        # Bad input: one clear line on stderr, no traceback.
        print(f"loopeval {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
