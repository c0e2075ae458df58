"""The runtime machinery controllers and webhooks stand on: Kubernetes client, informers
and caches, the work queue, leader election, logging and metrics."""
