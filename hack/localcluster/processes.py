"""Start and stop the control plane's processes, and only those.

Each process is started in its own session with its output in ``<state>/logs/<name>.log``;
``<state>/pids/<name>`` records its pid and kernel start time, so ``stop`` never signals a
process that merely reused the pid of one we started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Children started by this Python process, kept so they are reaped (not garbage-collected
#: while running); processes started by an earlier ``up`` are known by pid file only.
_children: dict[int, subprocess.Popen[bytes]] = {}


class ClusterError(RuntimeError):
    """A one-line, user-facing reason why the local cluster cannot start or stop."""


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces: split after its closing parenthesis.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z" and not _other_threads(pid):  # exited, not yet reaped: not running
        _reap(pid)
        return None
    # A zombie main thread whose other threads still run (a Go binary exiting while some
    # of its threads finish writing, as kube-apiserver its audit log) is still running:
    # not reapable yet, and stopped only once those threads are gone.
    return fields[19]


def _other_threads(pid: int) -> bool:
    """Whether a thread other than the main one of ``pid`` is still there."""
    try:
        return any(task.name != str(pid) for task in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False


@dataclass(frozen=True)
class Process:
    """One named process of a cluster, known by its pid file."""

    name: str
    state_dir: Path

    @property
    def log(self) -> Path:
        return self.state_dir / "logs" / f"{self.name}.log"

    @property
    def pidfile(self) -> Path:
        return self.state_dir / "pids" / self.name

    @property
    def argvfile(self) -> Path:
        return self.state_dir / "pids" / f"{self.name}.argv.json"

    def argv(self) -> list[str]:
        """The command line of the last start (so a component can be restarted as it was)."""
        argv: list[str] = json.loads(self.argvfile.read_text())
        return argv

    def pid(self) -> int | None:
        """The pid if the recorded process is still the one we started, else None."""
        try:
            pid_text, started = self.pidfile.read_text().split()
        except (OSError, ValueError):
            return None
        pid = int(pid_text)
        return pid if _start_time(pid) == started else None

    def running(self) -> bool:
        return self.pid() is not None

    def start(
        self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> int:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(
                f"--- start {time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(argv)}\n".encode()
            )
            out.flush()
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                cwd=cwd,
            )
        _children[proc.pid] = proc
        started = _start_time(proc.pid)
        self.pidfile.write_text(f"{proc.pid} {started}\n")
        self.argvfile.write_text(json.dumps(list(argv)))
        return proc.pid

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``; True if a process of ours was stopped."""
        pid = self.pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid() == pid:
            _reap(pid)
            time.sleep(0.05)
        if self.pid() == pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while self.pid() == pid:
                _reap(pid)
                time.sleep(0.05)
        self.pidfile.unlink(missing_ok=True)
        return True


def _reap(pid: int) -> None:
    """Collect a child's exit status so it does not linger as a zombie (no-op otherwise)."""
    child = _children.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _children[pid]
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    process: Process | None = None,
    interval: float = 0.2,
) -> float:
    """Poll ``check`` until it is true; fail with the process's log tail on timeout or exit.

    Returns the seconds waited.
    """
    start = time.monotonic()
    deadline = start + timeout
    while True:
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # noqa: S110 - a failing probe means "not yet"
            pass
        if process is not None and not process.running():
            raise ClusterError(
                f"{process.name} exited while waiting for {what}; last lines of {process.log}:\n"
                + process.tail()
            )
        if time.monotonic() > deadline:
            tail = f"; last lines of {process.log}:\n{process.tail()}" if process else ""
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")
        time.sleep(interval)
