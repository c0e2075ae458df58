"""The CLI's leader-election identity: the flag when given, else one unique to the process."""

from __future__ import annotations

import socket

from gpuoperator import cli


def test_the_identity_flag_is_used_as_given() -> None:
    assert cli.leader_identity("replica-a") == "replica-a"


def test_without_the_flag_each_process_gets_its_own_identity() -> None:
    one, two = cli.leader_identity(None), cli.leader_identity(None)
    assert one != two
    assert one.startswith(f"{socket.gethostname()}_")
