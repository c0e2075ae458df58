"""A TCP proxy on loopback that a test can partition: existing connections are cut and new
ones refused until ``heal()``. Put between a client and the API server to make a watch miss
events, as a network partition would."""

from __future__ import annotations

import contextlib
import socket
import threading


class PartitionableProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._partitioned = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def partition(self) -> None:
        """Cut every open connection and refuse new ones."""
        self._partitioned.set()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def heal(self) -> None:
        self._partitioned.clear()

    def close(self) -> None:
        self._closed.set()
        self.partition()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._partitioned.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns |= {client, server}
                self.accepted += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._conns -= {src, dst}
