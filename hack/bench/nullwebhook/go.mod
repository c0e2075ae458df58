module gpuoperator.local/nullwebhook

go 1.26.0
