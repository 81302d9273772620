"""The tuning records database (SQLite): one row per measured candidate.

A record is (workload, machine signature, decisions, seconds or the error that
disqualified it). The database is the search's memory: a run that is interrupted
and started again reads back what it measured (resume), and kiln.compile reads the
best record per workload for this machine (kiln.tune.apply). Several tuners may write
one file at once (WAL journal, a busy timeout, one short transaction per record).

Each record carries the kernel code version it was measured on (kiln.tune.version). Only
records of this kiln's version rank (`ranking`, `best`, `default_seconds`, `workloads`);
older ones are stale: `stale` counts them, the tuner uses them as seeds only. A database
written before records carried a version gains the column when opened (its records: stale).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import KilnError
from kiln.tune.version import code_version

SCHEMA = """
CREATE TABLE IF NOT EXISTS machines (signature TEXT PRIMARY KEY, info TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (workload TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload TEXT NOT NULL,
    signature TEXT NOT NULL,
    decisions TEXT NOT NULL,          -- JSON, keys sorted
    seconds REAL,                     -- NULL: the candidate failed (see error)
    error TEXT,
    is_default INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    version TEXT                      -- kernel code version (kiln.tune.version); NULL: written before it
);
CREATE INDEX IF NOT EXISTS records_by_task ON records (workload, signature);
"""


# A configuration replaces the default only when it is at least this much faster: a kernel timed
# alone (hot caches, back to back) mispredicts it in the model by about this much. mobilenet_v3_small
# batch 1, one thread (benchmarks/tune_resume.py, 3 runs of 240 s): records 1% faster than their
# defaults alone made the model 3-5% slower end to end (1.93-1.96 ms against 1.87 untuned).
MIN_GAIN = 0.03


def encode(decisions: dict) -> str:
    return json.dumps(decisions, sort_keys=True)


@dataclass(frozen=True)
class Record:
    id: int
    workload: str
    signature: str
    decisions: dict
    seconds: float | None
    error: str | None
    is_default: bool
    version: str | None = None

    @property
    def ok(self) -> bool:
        return self.seconds is not None


COLUMNS = "id, workload, signature, decisions, seconds, error, is_default, version"


def _record(r: tuple) -> Record:
    return Record(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], bool(r[6]), r[7])


class Database:
    """A records file; every method is its own transaction (safe across processes).
    `version`: the kernel code version whose records rank (default: this kiln's)."""

    def __init__(self, path: str | Path, version: str | None = None):
        self.path = str(path)
        self.version = version or code_version()
        try:
            self._con = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
            self._con.execute("PRAGMA journal_mode=WAL")
            self._con.executescript(SCHEMA)
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise KilnError(f"tuning database {self.path!r} cannot be opened: {e}") from None

    def _migrate(self) -> None:
        """A database from before records carried a version gains the column (NULL: stale)."""
        if "version" in {r[1] for r in self._con.execute("PRAGMA table_info(records)")}:
            return
        try:
            self._write("ALTER TABLE records ADD COLUMN version TEXT", ())
        except sqlite3.OperationalError as e:
            if "duplicate column" not in str(e):   # (another process migrated it just now)
                raise

    def close(self) -> None:
        self._con.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _write(self, sql: str, args: tuple) -> int:
        for attempt in range(50):   # a writer holding the lock past the busy timeout: try again
            try:
                return self._con.execute(sql, args).lastrowid
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise KilnError(f"tuning database {self.path!r} stayed locked")

    def add_machine(self, signature: str, info: dict) -> None:
        self._write("INSERT OR IGNORE INTO machines VALUES (?, ?)", (signature, json.dumps(info, sort_keys=True)))

    def add_workload(self, workload: str, description: str) -> None:
        self._write("INSERT OR IGNORE INTO workloads VALUES (?, ?)", (workload, description))

    def add(self, workload: str, signature: str, decisions: dict, seconds: float | None,
            error: str | None = None, is_default: bool = False, version: str | None = None) -> int:
        """A record measured on kernel code `version` (default: this database's)."""
        if (seconds is None) == (error is None):
            raise KilnError("a record has either a time or an error")
        return self._write("INSERT INTO records (workload, signature, decisions, seconds, error, is_default, "
                           "created, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           (workload, signature, encode(decisions), seconds, error, int(is_default), time.time(),
                            version or self.version))

    def records(self, workload: str, signature: str | None = None, current: bool | None = None) -> list[Record]:
        """Records of `workload` (of one machine signature, or of all), oldest first; `current`:
        only those of this kernel code version (True), only stale ones (False), all (None)."""
        sql = f"SELECT {COLUMNS} FROM records WHERE workload = ?"
        args: tuple = (workload,)
        if signature is not None:
            sql += " AND signature = ?"
            args += (signature,)
        if current is not None:
            sql += " AND version = ?" if current else " AND (version IS NULL OR version != ?)"
            args += (self.version,)
        return [_record(r) for r in self._con.execute(sql + " ORDER BY id", args).fetchall()]

    def stale(self, workload: str, signature: str) -> dict[str | None, int]:
        """How many valid records of `workload` on `signature` are of another kernel code
        version (not applied: kiln.tune.version.stale_reason says why), by version."""
        rows = self._con.execute("SELECT version, COUNT(*) FROM records WHERE workload = ? AND signature = ? "
                                 "AND seconds IS NOT NULL AND (version IS NULL OR version != ?) GROUP BY version",
                                 (workload, signature, self.version)).fetchall()
        return {v: n for v, n in rows}

    def ranking(self, workload: str, signature: str, limit: int = 1) -> list[tuple[Record, int]]:
        """The fastest valid configurations of `workload` on this machine signature, each as
        its newest record carrying its score, and how many times it was measured. A
        candidate scores its slowest measurement: one lucky measurement on a noisy machine
        does not make a best (the tuner measures the leaders again, `Tuner.confirm`); the
        default schedule scores its fastest (the unit the candidates' times are in)."""
        rows = self._con.execute(
            "SELECT MAX(id), CASE WHEN MAX(is_default) = 1 THEN MIN(seconds) ELSE MAX(seconds) END AS score, "
            "COUNT(*), MAX(is_default) FROM records WHERE workload = ? AND signature = ? AND seconds IS NOT NULL "
            "AND version = ? GROUP BY decisions ORDER BY score, MAX(id) LIMIT ?",
            (workload, signature, self.version, limit)).fetchall()
        out = []
        for rid, score, n, is_default in rows:
            r = self._con.execute(f"SELECT {COLUMNS} FROM records WHERE id = ?", (rid,)).fetchone()
            out.append((Record(r[0], r[1], r[2], json.loads(r[3]), score, r[5], bool(is_default), r[7]), n))
        return out

    def best(self, workload: str, signature: str, min_gain: float | None = None) -> Record | None:
        """The fastest valid configuration of `workload` measured on this machine signature
        (`ranking`'s first), unless it beats the default schedule by less than `min_gain`
        (default MIN_GAIN): then the default's."""
        ranked = self.ranking(workload, signature, 1 << 20)
        if not ranked:
            return None
        top = ranked[0][0]
        default = next((r for r, _ in ranked if r.is_default), None)
        gain = MIN_GAIN if min_gain is None else min_gain
        if default is not None and not top.is_default and top.seconds > default.seconds * (1 - gain):
            return default
        return top

    def default_seconds(self, workload: str, signature: str) -> float | None:
        """The default schedule's best time here, on this kernel code (the baseline speedups are against)."""
        row = self._con.execute("SELECT MIN(seconds) FROM records WHERE workload = ? AND signature = ? "
                                "AND is_default = 1 AND seconds IS NOT NULL AND version = ?",
                                (workload, signature, self.version)).fetchone()
        return row[0]

    def workloads(self, prefix: str, signature: str, current: bool = True) -> list[str]:
        """The workloads whose key starts with `prefix` that have records of `signature` on this
        kernel code (`current`), or valid records on other kernel code only (not `current`: stale)."""
        sql = "SELECT DISTINCT workload FROM records WHERE signature = ? AND substr(workload, 1, ?) = ? AND version = ?"
        if not current:
            sql = ("SELECT DISTINCT workload FROM records WHERE signature = ? AND substr(workload, 1, ?) = ? "
                   "AND seconds IS NOT NULL AND workload NOT IN (SELECT workload FROM records WHERE signature = ? "
                   "AND version = ?)")
        args = (signature, len(prefix), prefix, *(() if current else (signature,)), self.version)
        rows = self._con.execute(sql + " ORDER BY workload", args).fetchall()
        return [r[0] for r in rows]

    def count(self, signature: str | None = None) -> int:
        sql, args = "SELECT COUNT(*) FROM records", ()
        if signature is not None:
            sql, args = sql + " WHERE signature = ?", (signature,)
        return self._con.execute(sql, args).fetchone()[0]
