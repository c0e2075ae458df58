"""HTTP(S) servers: health probes, metrics and admission webhooks, on asyncio with h11.

The webhooks fail closed (docs/design.md §6): while they cannot answer, nothing with GPU claim
references can be created anywhere in the cluster. So no peer may hold up another: every
connection is a coroutine on one event loop, each phase of a connection has its own
deadline, and handlers run on a thread pool that only ever sees complete requests.

Why asyncio with h11, not a WSGI/ASGI server: the threaded servers (cheroot) handshake and
read on threads a slow peer can hold; uvicorn and hypercorn run on an event loop, but
neither bounds how long a request may take to arrive (uvicorn's keep-alive timer is reset
by every byte and it has no request-start timeout; hypercorn's read timeout is per read, so
one byte every few seconds holds a connection forever), nor the connections per source.
h11 (the HTTP/1.1 state machine uvicorn, hypercorn and httpx use) parses; this package owns
the sockets and the clock. Behaviour under abuse is measured by the slow-client test in
``test/unit/admission``.

A connection's life, with the :class:`Limits` that bound it:

1. accepted within ``max_connections`` in all and ``max_connections_per_source`` per
   source address, making room as follows (a connection is *waiting* while it waits for
   its handshake, its next request or the rest of one, *busy* while it is being answered):

   * at its source's limit, the oldest waiting connection of that source is closed; when
     all of them are busy, the new one is closed at once. A flood from one address churns
     its own sockets;
   * at the server's limit, the source holding the most connections gives one up (the
     newest-connected source among equals): its oldest waiting connection, or, when all of
     its connections are busy and it holds two or more beyond the newcomer's source, its
     oldest busy one (that request is dropped unanswered). A newcomer whose source holds
     as many as any makes room with its own oldest waiting connection, or is closed at
     once. So no set of busy connections from a few sources can hold every slot against
     a source that holds fewer (the API server's), and the source holding the most cannot
     push out anyone else's;
2. TLS handshake within ``handshake_timeout`` of the accept (a socket that never starts
   one costs its slot for that long, and nobody else anything). With a client CA
   (:class:`servercerts.ClientCA` on the certificate source) the peer must present a
   certificate it signed, or the connection ends at the handshake;
3. each request's head (request line and headers, at most ``max_header_bytes``) within
   ``header_timeout``: from the handshake for the first request, from its first byte for
   the next ones; between requests a kept-alive connection may stay idle ``idle_timeout``;
4. the body (at most ``max_body`` bytes, or the path's own limit in ``body_limits``; 413
   naming the limit beyond; ``Content-Length`` or chunked) within ``body_timeout`` from
   the end of the head. Each body's first ``small_body`` bytes are
   its own; a larger body takes room for the rest (its ``Content-Length``, or
   ``max_body`` when chunked) from ``max_buffered_bytes`` for all bodies together, all
   at once before reading it, and holds it until its answer is ready (a body that finds
   no room waits, its bytes left in the kernel, until its deadline; then 503). So large
   bodies, sent or held half-sent, cannot stall small ones (the API server's), cannot
   deadlock each other, and memory stays bounded whatever peers send;
5. the whole request waits for its handler in a queue of at most ``max_queued`` requests,
   served round-robin by source address (one request of each waiting source in turn), so
   a request waits for one request of each other source, not for everything one source
   sent; the request of a source with none waiting and none served in the current round
   goes first, so a source sending a request at a time (the API server, as a rule) waits
   for none. When the queue is full, the newest request of the source with the most waiting
   (the new one when its source has as many) is answered 429 with ``Retry-After``
   (client-go's REST client, which the API server calls webhooks with, retries such an
   answer), held ``throttle_hold`` before it is sent so that a client ignoring it costs
   one cheap request per connection per hold: a flood refuses its own requests. The
   handler runs on the server's thread pool (``workers``) with the whole request, so it
   never waits on a peer; an answer not ready within ``handler_timeout`` of the request's
   arrival is a 503.
   Paths the server is told are ``inline`` (handlers that only read memory and answer in
   well under a millisecond, such as webhooks deciding on caches) are answered on the event
   loop itself when their body is at most ``small_body`` bytes (from a queue of their own,
   so they never wait for a pool thread): the hop to a pool thread
   and back costs two GIL hand-offs, each of which waits up to the interpreter's switch
   interval while another thread of the process computes, which is more than such a
   handler takes. An inline handler holds up the loop while it runs, so one that may wait
   (on the network, a lock held long) must not be inline;
6. the answer is written within ``write_timeout`` (a peer that does not read is dropped);
   after ``max_requests`` requests the connection is closed (``Connection: close``).

Across phases 2 to 6 a connection holds one of its source's ``max_active_per_source``
*turns* while it handshakes (from the peer's first byte) and while it has a request in
progress (from the request's first byte to its answer written); the source's other
connections wait for a turn, first come first served, their bytes not parsed
(:class:`fairness.Turns`). A request whose turn has not come by the end of its head's deadline is
answered 429 with ``Retry-After`` and its connection closed (it was not read). So however
many connections one address holds, at most that many of its handshakes and requests are
before the event loop at a time, and every other source's steps wait behind that many of
its steps, not behind all of them; a connection that sends nothing holds no turn.

A deadline that expires closes the connection (with a 408 when part of a request had
arrived); a request h11 cannot parse is a 400 (431 for oversized heads) naming the problem.

Certificates: a server with TLS asks its :class:`servercerts.CertificateSource` for an
``ssl.SSLContext`` at every handshake (:mod:`gpuoperator.runtime.servercerts`), so a new
certificate serves the next connection without a restart.

Memory, chosen and measured (``make fuzz`` prints it): every buffer is bounded and the
threads are few and fixed (one event loop per server plus its handler pool), so the
resident size under abuse is the baseline plus what the limits allow:

* a connection with TLS state costs about 300 KiB (asyncio gives each one a 256 KiB read
  buffer), so that state is made only once the peer sends its first byte: a socket that
  never starts TLS costs a file descriptor;
* bodies hold at most ``max_connections * small_body + max_buffered_bytes`` in all
  until their answers are ready; parsing one takes about twice its size again while its
  handler runs, so at most ``workers`` such copies exist at once;
* freed memory is not always returned to the system at once (glibc keeps arenas per
  thread); with few threads that is bounded too.

The package, one concept a module: :mod:`.routing` (requests, responses, paths to
handlers), :mod:`.limits`, :mod:`.listener` (the socket, accept and connection limits, TLS,
turns), :mod:`.connection` (HTTP/1.1 exchanges, keep-alive, bodies' memory budget),
:mod:`.dispatching` (handler queues, inline and pooled handlers), :mod:`.fairness` (the fair
queue and the turns), :mod:`.metrics`. Importers use the names re-exported here.
"""

from gpuoperator.runtime.serving.limits import Limits, parse_address
from gpuoperator.runtime.serving.listener import Server
from gpuoperator.runtime.serving.routing import (
    MAX_TRACEBACK,
    MAX_TRACEBACK_LINE,
    App,
    Handler,
    Request,
    Response,
    app,
    bounded_traceback,
    text,
)

__all__ = [
    "MAX_TRACEBACK",
    "MAX_TRACEBACK_LINE",
    "App",
    "Handler",
    "Limits",
    "Request",
    "Response",
    "Server",
    "app",
    "bounded_traceback",
    "parse_address",
    "text",
]
