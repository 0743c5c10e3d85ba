"""Keeping freed memory: a process that frees and re-allocates large blocks faults in far
fewer fresh pages once ``keep_freed_memory`` applied; a user's glibc setting stands."""

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from loopeval.common.allocator import keep_freed_memory
    applied = keep_freed_memory() if sys.argv[1] == "keep" else None
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(20 << 18, dtype=np.float32); del a  # 20 MiB: glibc's dynamic threshold rises to it
    before = faults()
    for _ in range(10):
        blocks = [np.ones(15 << 18, dtype=np.float32) for _ in range(3)]  # 45 MiB freed at once: trimmed
        del blocks
    print(applied, faults() - before)
""")


def _probe(mode: str, env=None) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env=env).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    _, default = _probe("default")
    applied, kept = _probe("keep")
    assert applied == "True"
    assert kept < default / 5, (kept, default)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_users_glibc_setting_stands():
    import os

    applied, _ = _probe("keep", env={**os.environ, "MALLOC_TRIM_THRESHOLD_": "1"})
    assert applied == "False"
