"""Watchers in-process against a real database: dispatch, answers, the write path, scheduling, logs, probes."""
