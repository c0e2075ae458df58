"""Test harness: for the e2e suite cluster access, namespaces, waiting and the KubeVirt
stand-in; for unit tests the object builders (``objects``) and the cluster-less doubles
(``offline``: the fake API server, the Events recorder, caches made by the product's own
registration). Test infrastructure only; never imported by the product."""
