"""The pure core: what feedproc's rules are, with no database, network or clock of its own.

`models` (items, answers and their validation), `records` (what the watcher and the store exchange),
`errors` (every exception, with its exit code and HTTP status), `gates` (the fan-in rules), `windows`
(time windows of the day) and `policy` (retries and how an answer becomes an outcome). Nothing here
imports SQLAlchemy or any other module of feedproc: import-linter checks it in CI."""
