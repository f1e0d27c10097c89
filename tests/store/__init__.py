"""The store on every database (SQLite and PostgreSQL): its operations, guards and SQL plans."""
