"""The one translation between planaria.v1 messages and our dataclasses."""
