"""Runtime backends."""
