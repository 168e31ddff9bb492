"""Database access: the embedded server, engines and session factories, models, migrations."""

from ragservice.db.engine import Database, error_summary, open_database

__all__ = ["Database", "error_summary", "open_database"]
