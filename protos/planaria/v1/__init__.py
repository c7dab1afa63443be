"""The gRPC contract between controller and agents (package planaria.v1) and its generated code."""
