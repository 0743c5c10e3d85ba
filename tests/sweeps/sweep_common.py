"""The sweeps' one way to run a loopeval command in process (``cli(argv)``) and to record a case's verdict (``case``)."""
import contextlib
import io
import traceback

from loopeval.cli import main


def cli(argv):
    """``(exit status or "TRACEBACK", the last stderr line as a list, stdout)``."""
    err = io.StringIO(); out = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except BaseException:
            code = "TRACEBACK"; err.write(traceback.format_exc())
    return code, err.getvalue().strip().splitlines()[-1:], out.getvalue()


results = []
"""Every case's verdict, in order."""


def case(name, fn):
    """Run ``fn`` (returning ``(verdict, detail)``), record its verdict and print one line; an
    exception is a TRACEBACK."""
    try:
        verdict, detail = fn()
    except BaseException as e:
        verdict, detail = "TRACEBACK", f"{type(e).__name__}: {e}"
    results.append(verdict)
    print(f"{verdict} | {name} | {str(detail)[:240]}", flush=True)
