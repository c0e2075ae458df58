"""gpuoperator's admission webhooks; they stand on ``gpuoperator`` only."""
