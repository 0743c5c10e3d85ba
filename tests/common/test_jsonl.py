"""Appends that cannot lose data: a line cut by a crash is moved to FILE.cut, where it can
still be read, and the next record starts on a fresh line (issue 32)."""

import json
import warnings

import pytest

from loopeval.common.jsonl import append_jsonl, repair_tail
from loopeval.evaluation.responses import ResponseStore

OUTCOME = {"generated_tokens": 2, "finished": True, "forced_at": None, "repetition_stop_at": None}


def test_a_resume_store_cut_by_a_crash_keeps_its_rows_and_its_cut_line(tmp_path):
    store = ResponseStore(tmp_path)
    store.add([("a", [1, 2], OUTCOME, 5), ("b", [3, 4], OUTCOME, 5)])
    path = tmp_path / "loopeval_responses.jsonl"
    cut = json.dumps({"key": "c", "generated": [5, 6], "outcome": OUTCOME, "prompt_tokens": 5})[:30]
    with path.open("a") as f:
        f.write(cut)  # killed mid-write
    with pytest.warns(UserWarning, match=r"loopeval_responses.jsonl: its last line was cut .* moved it to .*\.cut"):
        resumed = ResponseStore(tmp_path)
    assert sorted(resumed.rows) == ["a", "b"]
    resumed.add([("c", [5, 6], OUTCOME, 5)])  # not appended onto the cut line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(ResponseStore(tmp_path).rows) == ["a", "b", "c"]
    assert (tmp_path / "loopeval_responses.jsonl.cut").read_text() == cut + "\n"


def test_a_cut_placements_line_does_not_stop_place_from_resuming(tmp_path):
    from loopeval.tools.placement.results import PlacementRow, append_placement, read_placements

    row = PlacementRow(loop="1:3x2", operator="repeat", beta=None, times=2, width=2, start=1, mlp_loop=False,
                       passes=8, multiplier=1.33, ppl=9.0, ppl_t=8.5, temperature=1.1, kl=0.2, tokens=100, tokens_val=50)
    path = tmp_path / "placements.jsonl"
    append_placement(path, row)
    with path.open("a") as f:
        f.write(json.dumps(row.to_dict())[:40])
    with pytest.warns(UserWarning, match="placements.jsonl: its last line was cut"):
        assert read_placements(path) == [row]
    append_placement(path, row)
    assert read_placements(path) == [row, row] and (tmp_path / "placements.jsonl.cut").is_file()


def test_a_whole_record_that_lost_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert repair_tail(path) is None
        append_jsonl(path, [{"a": 3}])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 1}, {"a": 2}, {"a": 3}]
    assert not (tmp_path / "x.jsonl.cut").exists()
