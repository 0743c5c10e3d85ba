"""Issue 39's classes as tables of malformed inputs run through the real command: lower-layer
exceptions named at the boundary where the input is known, loopeval's own files parsed
strictly, sibling commands agreeing on one option, a study checked in one pass."""

import json
import re
import os
import socket

import pytest

from loopeval.cli import main
from loopeval.common.outputs import LOCK_NAME

HOST = socket.gethostname()


@pytest.mark.parametrize("lock", [
    b"0", b"-1", b"true", b"4194305", b"99999999999999999999999",
    json.dumps({"host": HOST, "pid": 0}).encode(),
    json.dumps({"host": HOST, "pid": True}).encode(),
    json.dumps({"host": HOST, "pid": -1}).encode(),
    json.dumps({"host": HOST, "pid": 10 ** 30}).encode(),
    json.dumps({"host": HOST, "pid": 12, "started": "soon"}).encode(),
    json.dumps({"host": 7, "pid": 12}).encode(),
    b"\xff\xfe{\x00", b"garbage", b"",
], ids=lambda b: b[:24].decode("latin-1"))
def test_a_lock_not_written_by_loopeval_is_named_with_how_to_remove_it(tmp_path, capsys, lock):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_bytes(lock)
    assert main(["place", "--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "no-data"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / LOCK_NAME} is not a lock written by loopeval" in err, err
    assert f"if no loopeval process uses {out}, delete {out / LOCK_NAME}" in err and "Traceback" not in err
    assert (out / LOCK_NAME).read_bytes() == lock  # nothing taken over or removed


def test_a_file_named_replaced_is_refused_naming_it(tmp_path):
    from loopeval.common.errors import UserError
    from loopeval.common.outputs import aside

    (tmp_path / ".replaced").write_text("mine")
    with pytest.raises(UserError, match=r"\.replaced is not a folder: .*move or delete that file"):
        aside(tmp_path, "report")
    assert (tmp_path / ".replaced").read_text() == "mine"


@pytest.mark.parametrize("value", ["²", "٣", "1_0", "0x4", " ", "+", "4.0", "1e1"])
def test_a_thread_value_that_is_not_ascii_digits_is_refused_naming_the_variable(value):
    from loopeval.common.errors import UserError
    from loopeval.common.threads import check_threads

    with pytest.raises(UserError, match=rf"LOOPEVAL_THREADS={re.escape(repr(value))}: expected a whole number of threads"
                       r".*in ASCII digits; set LOOPEVAL_THREADS to such a number or unset it"):
        check_threads(value, "LOOPEVAL_THREADS")
