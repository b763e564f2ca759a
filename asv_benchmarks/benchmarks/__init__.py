"""fastring's asv benchmarks: kernels, fusion, compression and 2-rank collectives."""
