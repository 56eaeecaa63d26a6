"""One ahead-of-time build worker process (started by codegen/build.py, never by hand).

It is a plain `python -c` child, not a multiprocessing one, so it never re-imports the parent's
main script: a script without an `if __name__ == "__main__":` guard can build on first use.
It reads one JSON task per line on stdin and answers one JSON line on its original stdout; what
the compiler prints outside the captured ptxas log goes to stderr. It dies with its parent
(PR_SET_PDEATHSIG), so a `kill -9` of `b12x-codegen build` leaves no orphan compiles behind.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        armed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        armed = False
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    if not armed:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, name="b12x-parent-watch", daemon=True).start()


def main(parent: int) -> None:
    _die_with_parent(parent)
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from .build import build_task

    try:
        for line in sys.stdin:
            try:
                out = {"result": build_task(**json.loads(line))}
            except Exception as e:
                out = {"error": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}
            answers.write(json.dumps(out) + "\n")
            answers.flush()
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        os._exit(130)
