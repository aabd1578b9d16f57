"""The log seam: nodes that turn proposed commands into durable, applied state."""
