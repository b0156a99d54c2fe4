"""Rerun, once, the tests whose xdist worker died under them (``make test``).

Usage: ``python -m tests.rerun_crashed LOG``, after a failed ``pytest -n ...``
run whose output is in LOG. A worker killed by a native fault (a signal, not a
Python error) fails the test it was running; xdist names it in a line
``worker 'gwN' crashed while running 'NODEID'``. When every failure that
pytest recorded (``.pytest_cache``'s last-failed list) is such a test, they
are run again in one process and this exits with that run's status; otherwise
it exits 1 at once: a failure of the tests themselves is never retried.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

CRASH = re.compile(r"worker '\w+' crashed while running '([^']+)'")


def main(log: str) -> int:
    crashed = set(CRASH.findall(Path(log).read_text(errors="replace")))
    cache = Path(".pytest_cache/v/cache/lastfailed")
    failed = set(json.loads(cache.read_text())) if cache.exists() else set()
    if not crashed or not failed or not failed <= crashed:
        return 1
    print(f"dcjax: a test worker crashed; rerunning {len(failed)} test(s) once: {sorted(failed)}")
    return subprocess.call([sys.executable, "-m", "pytest", "-q", *sorted(failed)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
