"""Write the item list of a task's full test set that ships with loopeval
(:data:`loopeval.evaluation.metrics.TEST_SET_ITEMS`): per item, one short hash of its first
field and one of all its fields (:func:`~loopeval.evaluation.metrics.item_key`), sorted; never
the data itself.

    python benchmarks/make_test_items.py ../shared/data/gsm8k/test.jsonl question,answer \
        loopeval/evaluation/test_items/gsm8k_test_items.txt
"""

import json
import sys
from pathlib import Path

from loopeval.evaluation.metrics import item_key


def main(data: str, fields: str, out: str) -> None:
    names = tuple(fields.split(","))
    rows = [json.loads(line) for line in Path(data).read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = sorted({f"{item_key(row, names[:1])} {item_key(row, names)}" for row in rows})
    if len({line.split()[0] for line in lines}) != len(rows):
        raise SystemExit(f"{data}: {len(rows)} rows give {len(lines)} distinct {names[0]!r} hashes")
    Path(out).write_text("".join(line + "\n" for line in lines), encoding="ascii")
    print(f"{out}: {len(lines)} items")


if __name__ == "__main__":
    main(*sys.argv[1:])
