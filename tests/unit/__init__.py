"""The pure core, tested directly: no database, no processes."""
