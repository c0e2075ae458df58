"""``Process.stop`` returns only once the process it started is gone, even when /proc
shows its main thread a zombie while other threads still run (a Go binary flushing as it
exits, kube-apiserver writing its audit log): such a process is not yet reapable, and a
stop that trusted the zombie state left it to outlive the cluster's ``down``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from localcluster.processes import Process, _children

#: The main thread ignores SIGTERM and exits (pthread_exit: the process's leader turns
#: zombie), a second thread lives on for 30 s.
ZOMBIE_LEADER = """
import ctypes, signal, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
threading.Thread(target=time.sleep, args=(30,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_stop_waits_until_a_process_with_a_zombie_leader_is_gone(tmp_path: Path) -> None:
    proc = Process("zombie-leader", tmp_path)
    pid = proc.start([sys.executable, "-c", ZOMBIE_LEADER])
    child = _children[pid]
    deadline = time.monotonic() + 20
    while state(pid) != "Z":
        assert time.monotonic() < deadline, f"the leader never turned zombie: {state(pid)}"
        assert child.poll() is None, proc.tail()
        time.sleep(0.05)
    assert child.poll() is None, "a zombie leader with a live thread is not reapable yet"
    stopped = time.monotonic()
    assert proc.stop(timeout=1)
    assert child.poll() is not None, "stop returned while the process still ran"
    assert time.monotonic() - stopped < 10
    assert not proc.running()
