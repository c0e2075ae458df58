"""``make fuzz``: the bad-input sweep at scale against the webhook server as its own
process, with its resident memory measured.

1. starts the shipped webhook server (``harness.webhook_world``) over offline caches;
2. sends ``--requests`` (default 10,000) AdmissionReview-shaped requests, split evenly
   over the categories of ``harness.review_strategies``, each checked by the oracle
   (never a 5xx, a traceback or a refusal naming no field);
3. holds 200 idle sockets, 50 slowloris connections and 20 half-sent bodies open while
   timing good reviews, then sends bodies as large as the VMI webhook accepts (1 MiB)
   from 32 clients at once;
4. times genuine VMI reviews (from 127.0.0.1, fresh TLS connections) alone, then while 128
   kept-alive connections from four other addresses post forged VMI reviews as fast as
   they are answered (``flood.py``, in a process of its own as a tenant's pods are);
5. prints requests and outcomes per category, the latency figures (p50/p99 of the genuine
   reviews with and without the flood, printed, never asserted), the server's RSS at each
   step and its peak, and the lines the server logged at error level.

``--busy-rounds N`` repeats step 4 on fresh servers, and ``--baseline DIR`` times the
server of another checkout in each round as well (its ``gpuoperator``, ``admission`` and
``test/harness``), alternating with this one: figures compared on a shared machine only
mean something when taken in the same run.

Exits 1 when any answer failed the oracle or any good or genuine review failed. Bounded: every
loop has a count, every request a timeout, every address is loopback.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuoperator import cli
from harness import abuse
from harness.review_strategies import CATEGORIES, KeptAlive, check_answer
from harness.waiting import wait_for
from harness.webhook_world import ORDER_PATH, VMI_PATH, body, order, vmi

#: Kept-alive connections of forged VMI reviews, and the addresses they come from.
FLOOD = 128
FLOOD_SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


class Peak:
    """Polls the server's RSS every 50 ms and keeps the largest."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, abuse.rss_kib(self.pid))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def run_category(
    client: KeptAlive,
    name: str,
    path: str,
    bodies: st.SearchStrategy[bytes],
    examples: int,
    counts: Counter[str],
    failures: list[str],
) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=bodies)
    def one(data: bytes) -> None:
        try:
            status, answer = client.send(path, data)
            counts[check_answer(status, answer, data)] += 1
        except (AssertionError, OSError, ValueError) as exc:
            counts["FAILED"] += 1
            failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")

    one()


def sweep(target: abuse.Target, per_category: int) -> tuple[dict[str, Counter[str]], list[str]]:
    outcomes: dict[str, Counter[str]] = {}
    failures: list[str] = []
    client = KeptAlive(target)
    for name, (path, bodies) in sorted(CATEGORIES.items()):
        counts: Counter[str] = Counter()
        outcomes[name] = counts
        run_category(client, name, path, bodies, per_category, counts, failures)
    client.close()
    return outcomes, failures


def slow_clients(target: abuse.Target, good: int) -> tuple[list[float], int, int]:
    abusers = abuse.Abusers(
        target,
        idle=200,
        slowloris=50,
        half_bodies=20,
        path=ORDER_PATH,
        sources=("127.0.0.2", "127.0.0.3", "127.0.0.4"),
    )
    times: list[float] = []
    failed = 0
    data = body(order())
    try:
        held = abusers.held
        for _ in range(good):
            try:
                answer = abuse.post(target, ORDER_PATH, data, timeout=5.0)
                if answer.status == 200:
                    times.append(answer.seconds)
                else:
                    failed += 1
            except OSError:
                failed += 1
    finally:
        abusers.close()
    return times, failed, held


def genuine(target: abuse.Target, n: int, kept_alive: bool = False) -> tuple[list[float], int]:
    """``n`` genuine VMI reviews from 127.0.0.1, each on a fresh TLS connection or all on one
    kept alive (as the API server sends them): their times, and how many failed."""
    data = body(vmi('[{"claim":"hold-b"}]', name="vm-genuine"))
    times: list[float] = []
    failed = 0
    conn = abuse.KeptAlive(target) if kept_alive else None
    try:
        for _ in range(n):
            try:
                if conn is not None:
                    answer = conn.post(VMI_PATH, data)
                else:
                    answer = abuse.post(target, VMI_PATH, data, timeout=10.0)
            except (OSError, http.client.HTTPException):
                failed += 1
                continue
            if answer.status == 200 and json.loads(answer.body)["response"]["allowed"]:
                times.append(answer.seconds)
            else:
                failed += 1
    finally:
        if conn is not None:
            conn.close()
    return times, failed


#: How the genuine reviews are sent: (label, kept alive).
WAYS = (("fresh connections", False), ("one kept-alive connection", True))


def busy_clients(
    target: abuse.Target, n: int
) -> tuple[dict[str, tuple[list[float], list[float]]], int, str]:
    """Genuine VMI reviews timed without, then with the flood of forged ones, both ways
    (:data:`WAYS`): for each way the times alone and beside the flood; the failures; and
    what the flood got."""
    quiet: dict[str, list[float]] = {}
    loud: dict[str, list[float]] = {}
    failed = 0
    for label, kept in WAYS:
        quiet[label], failures = genuine(target, n, kept)
        failed += failures
    flooding = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("flood.py")),
            str(target.port),
            str(target.ca),
            str(FLOOD),
            *FLOOD_SOURCES,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert flooding.stdin is not None and flooding.stdout is not None
    try:
        if flooding.stdout.readline().strip() != "ready":
            raise RuntimeError("the flood did not start")
        for label, kept in WAYS:
            loud[label], failures = genuine(target, n, kept)
            failed += failures
    finally:
        flooding.stdin.close()
        got = json.loads(flooding.stdout.readline() or "{}")
        flooding.wait(10)
    shown = (
        f"answered {got.get('statuses')}, connections closed by the server "
        f"{got.get('closed')}, setup failures {got.get('setup_failures')}"
    )
    return {label: (quiet[label], loud[label]) for label, _ in WAYS}, failed, shown


def big_bodies(target: abuse.Target, clients: int) -> Counter[str]:
    review = vmi()
    largest = cli.WEBHOOK_BODY_LIMITS[VMI_PATH]
    review["request"]["object"]["metadata"]["annotations"] = {"pad": "x" * (largest - 1024)}
    data = json.dumps(review).encode()
    statuses: Counter[str] = Counter()

    def one(_: int) -> str:
        try:
            return str(abuse.post(target, VMI_PATH, data, timeout=20.0).status)
        except OSError as exc:
            return type(exc).__name__

    with ThreadPoolExecutor(clients) as pool:
        statuses.update(pool.map(one, range(clients)))
    return statuses


@contextmanager
def webhook_process(
    directory: Path, tree: Path | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], abuse.Target]]:
    """The webhook server (of ``tree``, a checkout, or of this one) as its own process,
    logging into ``directory``; stopped on leaving."""
    env, cwd = None, None
    if tree is not None:
        # ``python -m`` puts the working directory first on sys.path: run in the tree, or
        # this checkout's modules would shadow the baseline's.
        cwd = str(tree)
        path = os.pathsep.join(str(tree / sub) for sub in (".", "hack", "test"))
        env = {**os.environ, "PYTHONPATH": path}
    with (directory / "server.log").open("wb") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-m", "harness.webhook_world", str(directory)],
            stdin=subprocess.PIPE,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
        )
    try:
        wait_for("the webhook server", (directory / "port").exists, until=bool, timeout=30)
        yield server, abuse.Target(int((directory / "port").read_text()), directory / "ca.crt")
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(10)


def busy_line(
    label: str, figures: tuple[dict[str, tuple[list[float], list[float]]], int, str]
) -> str:
    by_way, failed, flood_shown = figures

    def ms(values: list[float], q: float) -> str:
        return f"{abuse.percentile(values, q) * 1000:.1f}"

    ways = "; ".join(
        f"on {way}: alone p50 {ms(quiet, 50)} ms, p99 {ms(quiet, 99)} ms, beside the flood "
        f"p50 {ms(loud, 50)} ms, p99 {ms(loud, 99)} ms"
        for way, (quiet, loud) in by_way.items()
    )
    return (
        f"busy clients{label}: genuine VMI reviews (the flood: {FLOOD} kept-alive connections "
        f"of forged ones from {len(FLOOD_SOURCES)} addresses) {ways}; failures {failed}; "
        f"the flood {flood_shown}"
    )


def busy_rounds(rounds: int, baseline: Path | None) -> list[str]:
    """Step 4 again on fresh servers: ``rounds - 1`` more of this checkout's and, with a
    ``baseline``, ``rounds`` of its, alternating."""
    lines = []
    for n in range(rounds):
        # This checkout's first round is the main run's step 4.
        trees = ([baseline] if baseline is not None else []) + ([None] if n else [])
        for tree in trees:
            with webhook_process(Path(tempfile.mkdtemp(prefix="fuzz-busy-")), tree) as (_, target):
                label = f" (round {n + 1}, {'baseline ' + str(tree) if tree else 'this tree'})"
                lines.append(busy_line(label, busy_clients(target, 200)))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--busy-rounds", type=int, default=1)
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args()
    per_category = max(1, args.requests // len(CATEGORIES))
    directory = Path(tempfile.mkdtemp(prefix="fuzz-webhooks-"))
    log_path = directory / "server.log"
    with webhook_process(directory) as (server, target):
        peak = Peak(server.pid)
        rss = {"start": abuse.rss_kib(server.pid)}
        start = time.perf_counter()
        outcomes, failures = sweep(target, per_category)
        sweep_seconds = time.perf_counter() - start
        rss["after the sweep"] = abuse.rss_kib(server.pid)
        times, failed, held = slow_clients(target, 200)
        rss["after slow clients"] = abuse.rss_kib(server.pid)
        big = big_bodies(target, 32)
        rss["after 32 bodies of 1 MiB"] = abuse.rss_kib(server.pid)
        busy = busy_clients(target, 200)
        rss["after the flood of forged reviews"] = abuse.rss_kib(server.pid)
        peak.stop()
    more = busy_rounds(args.busy_rounds, args.baseline)
    total = sum(sum(c.values()) for c in outcomes.values())
    print(f"sweep: {total} requests in {sweep_seconds:.1f}s")
    for name, counts in outcomes.items():
        shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(f"  {name:9} {sum(counts.values()):6}  {shown}")
    for failure in failures[:10]:
        print(f"  FAILED {failure}")
    print(
        f"slow clients: {held} abusive connections held; {len(times)} good reviews: "
        f"p50 {abuse.percentile(times, 50) * 1000:.1f} ms, "
        f"p99 {abuse.percentile(times, 99) * 1000:.1f} ms, failures {failed}"
    )
    print("big bodies: " + ", ".join(f"{k} x{v}" for k, v in sorted(big.items())))
    print(busy_line("", busy))
    for line in more:
        print(line)
    print(
        "server RSS: "
        + ", ".join(f"{k} {v / 1024:.0f} MiB" for k, v in rss.items())
        + f", peak {peak.peak / 1024:.0f} MiB"
    )
    errors = [
        line
        for line in log_path.read_text().splitlines()
        if "[error" in line or "Traceback" in line
    ]
    print(f"server error lines: {len(errors)}")
    for line in errors[:5]:
        print(f"  {line[:300]}")
    return 1 if failures or failed or busy[2] else 0


if __name__ == "__main__":
    sys.exit(main())
