"""gpuoperator: GPUs as a catalog a multi-tenant cloud can sell.

The core's modules, in layers from the top (each may import only those below it; enforced
by import-linter, see the contracts in pyproject.toml):

* ``gpuoperator.cli``       the composition root, the only module that wires
  ``controllers`` and ``admission`` together;
* ``gpuoperator.report`` and ``gpuoperator.claim_status``, side by side: the report
  ``gpuoperator status`` prints, and the write-back of claim statuses (assume, write,
  confirm) the controllers share;
* ``gpuoperator.ledger``  the live GPU ledger (holds per node, the class catalog) fed by the
  caches;
* ``gpuoperator.assumptions`` claim states counted ahead of the watch (the assume cache);
* ``gpuoperator.caches``    the shared informers, one per kind, and their indexes;
* ``gpuoperator.kinds``     the product's kinds and KubeVirt's, as client classes;
* ``gpuoperator.runtime``   informers, work queue, controllers, leader election, client,
  servers (the machinery); generic: it imports neither ``names`` nor ``kinds``;
* ``gpuoperator.pki``       X.509 for the self-managed webhook certificates;
* ``gpuoperator.settings`` and ``gpuoperator.model``, side by side: the operator's settings,
  and the pure model (rules as functions of plain data);
* ``gpuoperator.names``     every name the operator shares with the cluster (one place).

``model``, ``settings`` and ``names`` are pure: no client, no HTTP, no I/O library, neither
the runtime nor the CLI.

Above the core sit ``controllers`` and ``admission``: they stand on it, never import each
other, and never import ``gpuoperator.cli``.
"""

__version__ = "0.1.0"
