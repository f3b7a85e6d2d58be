"""memfs: a durable, versioned workspace store mounted as a plain directory."""

__version__ = "0.1.0"
