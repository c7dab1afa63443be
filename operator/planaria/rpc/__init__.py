"""The controller's gRPC client of the agents: `ports.Agent` over planaria.v1."""
