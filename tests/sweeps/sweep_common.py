"""The sweeps' one way to run a loopeval command in process: ``cli(argv)``."""
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
