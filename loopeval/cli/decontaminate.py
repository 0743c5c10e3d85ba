"""``loopeval decontaminate``."""

from __future__ import annotations


def add(sub) -> None:
    p = sub.add_parser(
        "decontaminate",
        help="remove training rows that share an n-gram of lower-cased words with lm-eval test sets",
        description=(
            "Copy DATA (JSONL) to --out without every row that shares an n-gram (default 13) of lower-cased words "
            "with a test document of the given lm-eval tasks or groups (default: the paper's GSM8K test, MATH-500, "
            "AIME 2024/2025 and GPQA-Diamond). Writes OUT.removed.jsonl (row, task, doc_id, shared n-gram) and "
            "OUT.decontamination.json, which training records in its manifest."
        ),
    )
    p.add_argument("data", help="training JSONL")
    p.add_argument("--against", type=lambda s: [t.strip() for t in s.split(",") if t.strip()], default=None,
                   metavar="TASK[,TASK...]", help="lm-eval tasks or groups (default: the paper's five test sets)")
    p.add_argument("--out", required=True, help="the decontaminated JSONL")
    p.add_argument("--n", type=int, default=None, help="n-gram length in words (default 13)")
    p.add_argument("--include-path", action="append", help="folder of further lm-eval task YAMLs (repeatable)")
    p.add_argument("--removed", help="where to list the removed rows (default OUT.removed.jsonl)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    p.set_defaults(func=run)


def run(args) -> int:
    from loopeval.common.outputs import check_outputs
    from loopeval.training.decontamination import DEFAULT_N, PAPER_TEST_SETS, decontaminate

    check_outputs({"--out": args.out, "--removed": args.removed}, [args.data, *(args.include_path or [])])
    result = decontaminate(args.data, out=args.out, against=args.against or PAPER_TEST_SETS,
                           n=args.n if args.n is not None else DEFAULT_N, include_path=args.include_path,
                           removed=args.removed, overwrite=args.overwrite)
    print(f"kept {result.kept} of {result.rows} rows -> {result.out}")
    print(f"removed {result.removed} -> {result.removed_path}"
          + "".join(f"\n  {task}: {n} rows" for task, n in result.removed_by_task.items()))
    print(f"record -> {result.record_path}")
    return 0
