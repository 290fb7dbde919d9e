"""The project's networks."""
