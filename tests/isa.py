"""The instruction-set settings the test suite must pass under (issue 38): torch's kernels,
MKL and oneDNN held back together to one level, since each picks its own at start-up.

    eval "$(python tests/isa.py avx2)" && python -m pytest tests -q -m "not slow"
    eval "$(python tests/isa.py --other)"    # a level other than this CPU's best (.ci/run)

Prints ``export`` lines for a shell; ``native`` unsets them all.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

LEVELS = {
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
"""From the widest to the baseline x86-64 level torch supports."""
VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def native() -> str:
    """This CPU's widest level as torch picks it with nothing held back."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"
    env = {k: v for k, v in __import__("os").environ.items() if k not in VARIABLES}
    found = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()
    return found if found in LEVELS else "default"


def other() -> str:
    """The next level below this CPU's own (the baseline where the CPU is at AVX2 or below)."""
    names = list(LEVELS)
    own = native()
    return names[min(names.index(own) + 1, len(names) - 1)] if own != "default" else "default"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("level", nargs="?", choices=[*LEVELS, "native"], help="the level to hold the libraries to")
    parser.add_argument("--other", action="store_true", help="a level other than this CPU's own")
    args = parser.parse_args()
    if args.other == (args.level is not None):
        parser.error("give a level or --other")
    level = other() if args.other else args.level
    if level == "native":
        print("unset " + " ".join(VARIABLES))
    else:
        print("export " + " ".join(f"{k}={v}" for k, v in LEVELS[level].items()))


if __name__ == "__main__":
    main()
