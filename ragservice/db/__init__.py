"""Database access: the embedded server, engines and session factories, models, migrations."""

from ragservice.db.engine import Database, open_database

__all__ = ["Database", "open_database"]
