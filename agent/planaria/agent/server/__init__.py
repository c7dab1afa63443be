"""The agent process: the gRPC AgentService over the runtime, health and mutual TLS."""
