"""Write the item list of a task's full test set that ships with loopeval
(:data:`loopeval.evaluation.metrics.TEST_SET_ITEMS`): one short hash per item of the doc
field named there, sorted; never the data itself.

    python benchmarks/make_test_items.py ../shared/data/gsm8k/test.jsonl question \
        loopeval/evaluation/test_items/gsm8k_test_question.txt
"""

import json
import sys
from pathlib import Path

from loopeval.evaluation.metrics import item_hash


def main(data: str, field: str, out: str) -> None:
    rows = [json.loads(line) for line in Path(data).read_text(encoding="utf-8").splitlines() if line.strip()]
    hashes = sorted({item_hash(row[field]) for row in rows})
    if len(hashes) != len(rows):
        raise SystemExit(f"{data}: {len(rows)} rows give {len(hashes)} distinct {field!r} hashes")
    Path(out).write_text("".join(h + "\n" for h in hashes), encoding="ascii")
    print(f"{out}: {len(hashes)} items")


if __name__ == "__main__":
    main(*sys.argv[1:])
