"""Whole programs: the CLI, the HTTP API, the dashboard in a browser, watcher processes killed
and stopped, the benchmark."""
