"""Run ``vmsched`` with the garbage collector's work counted (for bench_decisions.py --gc).

    python bench/gc_probe.py STATS_FILE vmsched-arguments...

Every collection's CPU time (``time.thread_time`` of the collecting thread,
from ``gc.callbacks``) and count are summed per generation; a daemon thread
writes them to STATS_FILE as JSON twice a second (the bench reads them
before and after each measurement). The probe costs two callbacks per
collection, the same on every side.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from typing import Any

_started: dict[int, float] = {}
stats: dict[str, Any] = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0], "collected": [0, 0, 0]}


def _callback(phase: str, info: dict[str, Any]) -> None:
    generation = info["generation"]
    if phase == "start":
        _started[threading.get_ident()] = time.thread_time()
        return
    began = _started.pop(threading.get_ident(), None)
    if began is not None:
        stats["seconds"][generation] += time.thread_time() - began
    stats["collections"][generation] += 1
    stats["collected"][generation] += info.get("collected", 0)


def _writer(path: str) -> None:
    while True:
        tmp = path + ".tmp"
        with open(tmp, "w") as out:
            json.dump({**stats, "counts": gc.get_count(), "threshold": gc.get_threshold(),
                       "frozen": gc.get_freeze_count()}, out)
        os.replace(tmp, path)
        time.sleep(0.5)


def main() -> None:
    path = sys.argv[1]
    gc.callbacks.append(_callback)
    threading.Thread(target=_writer, args=(path,), name="gc-probe", daemon=True).start()
    from vmsched.cli import main as vmsched

    sys.argv = ["vmsched", *sys.argv[2:]]
    sys.exit(vmsched())


if __name__ == "__main__":
    main()
