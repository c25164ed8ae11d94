"""The one migration runner: a store's tables and their version in ``schema_versions``.

Every store (session, checkpoint, the chat tables) on either back end brings its
tables up to date here, on a `Tx` opened by the store's own connection code:

- tables and their version move together: a schema is created or migrated in the
  transaction that records it, so a crash never leaves tables without a version,
  or a version without its tables;
- processes starting at once neither collide in ``CREATE TABLE IF NOT EXISTS``
  nor migrate twice: the runner holds the schema lock first (`Tx.lock`);
- a database written by a newer release is refused, never downgraded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from webapp.stores.tx import Tx, split_statements

_LEDGER = (
    "CREATE TABLE IF NOT EXISTS schema_versions (name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
)


class SchemaVersionError(sqlite3.OperationalError):
    """The database's tables are of a version this code cannot use (newer, or with no
    migration from it). An ``OperationalError`` on either back end, as SQLite's own
    refusal to open a file is, so one handler catches both."""


@dataclass(frozen=True)
class Schema:
    """A store's tables, recorded as ``(name, version)`` in ``schema_versions``.

    ``sql`` creates the current version (``IF NOT EXISTS`` throughout);
    ``migrations`` maps an old version ``v`` to the SQL that upgrades it to
    ``v + 1``. Several schemas (different names) share one database.
    """

    name: str
    version: int
    sql: str
    migrations: Mapping[int, str]

    def check(self) -> Schema:
        """Split the SQLite form of every script now, so a typo fails at once."""
        for script in (self.sql, *self.migrations.values()):
            split_statements(script)
        return self

    async def apply(self, tx: Tx, where: str) -> None:
        """Create or migrate the tables; call inside an open write transaction."""
        await tx.lock("webapp.schema", "")
        await tx.execute(_LEDGER)
        rows = await tx.fetch("SELECT version FROM schema_versions WHERE name = ?", (self.name,))
        found = int(rows[0][0]) if rows else None
        if found == self.version:
            return
        if found is None:
            await tx.script(self.sql)
        elif found > self.version:
            raise SchemaVersionError(
                f"{where} holds {self.name!r} schema version {found}, newer than this "
                f"code's {self.version}; upgrade the application to use it"
            )
        else:
            for version in range(found, self.version):
                if version not in self.migrations:
                    raise SchemaVersionError(
                        f"no migration for {self.name!r} from schema version {version} "
                        f"to {version + 1} in {where}"
                    )
                await tx.script(self.migrations[version])
        await tx.execute(
            "INSERT INTO schema_versions (name, version) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET version = excluded.version",
            (self.name, self.version),
        )
