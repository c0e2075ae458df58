"""gpuoperator's controllers, one module each; they stand on ``gpuoperator`` only."""
