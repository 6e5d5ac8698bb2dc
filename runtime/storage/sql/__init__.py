"""SQL backends of the store: SQLite and Postgres over one transaction path, and migrations."""
