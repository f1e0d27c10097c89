"""The store on every database (SQLite, PostgreSQL and MariaDB): its operations, guards and SQL plans."""
