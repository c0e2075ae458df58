"""A loopback HTTP server standing in for the API server, for informer tests that need the
real client (its sockets, timeouts and chunked watch streams): a test supplies the request
handler; this module serves it, points an informer of pods at it, and tears both down."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pykube

from gpuoperator.runtime.client import Client
from gpuoperator.runtime.informing import Informer, InformerOptions


def answer_empty_list(handler: BaseHTTPRequestHandler, resource_version: str = "7") -> None:
    """Answer a list request with no items at ``resource_version``."""
    body = json.dumps({"items": [], "metadata": {"resourceVersion": resource_version}}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def open_watch(handler: BaseHTTPRequestHandler) -> None:
    """Send a watch's headers (a chunked stream follows, or nothing)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.wfile.flush()


def watch_handler(
    on_watch: Callable[[BaseHTTPRequestHandler], None], resource_version: str = "7"
) -> type[BaseHTTPRequestHandler]:
    """A request handler whose lists answer empty at ``resource_version`` and whose watch
    requests ``on_watch`` answers (headers with ``open_watch``, a stream, or silence)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if "watch=true" not in self.path:
                answer_empty_list(self, resource_version)
                return
            on_watch(self)

        def log_message(self, *_args: Any) -> None:
            pass

    return Handler


@contextmanager
def pod_informer(
    handler: type[BaseHTTPRequestHandler], release: threading.Event, options: InformerOptions
) -> Iterator[Informer]:
    """A (not yet started) informer of pods on a real client talking to ``handler`` served on
    loopback; on exit it is stopped, ``release`` is set (handlers waiting on it return) and
    the server is shut down."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    doc = {
        "clusters": [
            {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}
        ],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    informer = Informer(Client(lambda: pykube.KubeConfig(doc)), pykube.Pod, options)
    try:
        yield informer
    finally:
        informer.stop(timeout=10)
        release.set()
        server.shutdown()
        server.server_close()
