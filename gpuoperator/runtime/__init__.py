"""The runtime machinery controllers and webhooks stand on. It is generic (it knows no
product names) and holds one concept a module:

* the API server: ``client`` (requests, retries, limits, fencing, watches), ``kubeconfig``
  (where the client's configuration comes from), ``errors`` (typed API errors), ``kinds``
  (the Kubernetes kinds the runtime itself uses), ``protocols`` (the narrow parts of the
  client and the Event recorder a controller declares it needs);
* caches: ``informing`` (the informer: list and watch into a store, handlers told of every
  change), ``indexing`` (the store and its indexes), ``versions`` (which of two states of
  an object is newer), ``own_writes`` (a controller's own writes read over a cache that
  lags them), ``feeding`` (change notices that are not API objects);
* work: ``queueing`` (the work queue), ``ratelimiting`` (its retry delays), ``controlling``
  (workers and the reconcile contract), ``backoff`` (the retry delay of one loop),
  ``pacing`` (an object's changes of one interval gathered into one write);
* leadership: ``leading`` (the elector), ``leases`` (the record and the Lease store);
* the replica: ``managing`` (caches, election, controllers and servers of one process);
* serving: ``serving`` (the HTTPS servers), ``admitting`` (admission webhooks),
  ``servercerts`` (the servers' certificates), ``authorizing`` (who may scrape);
* telling: ``recording`` (Kubernetes Events), ``logs``, ``metrics``; and ``clock``, the
  injected time.
"""
