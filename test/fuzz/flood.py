"""A flood of forged VMI reviews in a process of its own, for ``fuzz_admission.py``:
``python test/fuzz/flood.py PORT CA CONNECTIONS SOURCE...``.

Its own process as a tenant's pods are their own: the genuine reviews are timed by a
client that does not share an interpreter lock with the flood (a thread of the flood would
hold it up to the switch interval at each step of every genuine review, and that wait
would be counted as the server's). Prints ``ready`` once every connection has been
answered, floods until standard input closes, then prints what it got as one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness import abuse
from harness.waiting import wait_for
from harness.webhook_world import VMI_PATH, body, vmi


def main() -> None:
    target = abuse.Target(int(sys.argv[1]), Path(sys.argv[2]))
    connections, sources = int(sys.argv[3]), sys.argv[4:]
    flood = abuse.Flood(
        target,
        connections=connections,
        path=VMI_PATH,
        # Another tenant's held claim, named by reviews nobody asked the API server for.
        body=body(vmi('[{"claim":"hold-a"}]', name="forged")),
        sources=sources,
    )
    try:
        wait_for("the flood to be answered", flood.answers, until=lambda a: a >= connections)
        print("ready", flush=True)
        sys.stdin.read()
        statuses = dict(flood.statuses)
    finally:
        flood.close()
    shown = {"statuses": statuses, "closed": flood.closed, "setup_failures": flood.setup_failures}
    print(json.dumps(shown), flush=True)


if __name__ == "__main__":
    main()
