"""Test harness shared by the e2e suite: cluster access, namespaces, waiting, and the
KubeVirt stand-in. Test infrastructure only; never imported by the product."""
