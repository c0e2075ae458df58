"""gpuoperator: GPUs as a catalog a multi-tenant cloud can sell.

Packages, in layers (enforced by import-linter, see pyproject.toml):

* ``gpuoperator.names``   every name the operator shares with the cluster (one place);
* ``gpuoperator.model``   the pure model: rules as functions of plain data, no I/O;
* ``gpuoperator.runtime`` caches, work queue, leader election, client (the machinery);
* ``gpuoperator.cli``     the composition root, the only module that wires
  ``controllers`` and ``admission`` together.
"""

__version__ = "0.1.0"
