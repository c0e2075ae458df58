"""A real Kubernetes control plane on loopback, without containers.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as plain
processes built from Go modules (``hack/build-binaries.sh``); kwok keeps the simulated GPU
nodes of a profile Ready and turns pods scheduled onto them Running. Used by ``make up`` and
by the e2e suite's session fixture. This is development tooling, not part of the product.
"""
