"""A local cluster of executor processes on loopback, for tests and benchmarks."""
