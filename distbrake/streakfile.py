"""`StreakFile`: the streaks of one machine's coding-agent hooks, in a small SQLite file every process shares.

Why a file: a coding agent runs `distbrake hook` as a new process for every
tool call, so an in-process record (`LoopBrake`, `memory://`) forgets the
streak between two calls. With no `DISTBRAKE_URL`, the hooks of one user keep
their streaks here instead: `$XDG_CACHE_HOME/distbrake/streaks.sqlite3` (else
`~/.cache/distbrake/`), a file only its owner can read. SQLite is in the standard
library (nothing to install, nothing to start), and its locking makes the step
atomic across processes: each check is one `BEGIN IMMEDIATE` transaction (one
writer at a time, readers never blocked in WAL mode) that reads the session's
record, applies the rule model's `step` (the same function `LoopBrake` applies),
and writes it back. A local server (`distbrake serve` on localhost) would do
as well but must be started and kept running; a team shares Redis instead.

Stored per session, as in Redis: the call hash, the count, the call ids the
replay rule needs, the tool name, the last observed result digest (progress-aware
tools), the cycle ring's hash prefixes, the time of the last check and when the
record expires (the TTL). Never the arguments.

Standard library only: the hook's start-up is part of every tool call.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import orjson

from .model import Counted, CycleRule, Halt, Rules, Streak, check, fail, observe

__all__ = ["DEFAULT_MAX_REPEATS", "DEFAULT_TIMEOUT", "DEFAULT_TTL", "Row", "StreakFile", "default_path"]

# The defaults of `BrakeSettings` (settings.py), repeated here so that the hook's light path imports
# no pydantic; tests/test_hook.py checks that they are equal.
DEFAULT_MAX_REPEATS = 3
DEFAULT_TTL = 3600.0
DEFAULT_TIMEOUT = 0.5
DEFAULT_PREFIX = "distbrake"
FILE_NAME = "streaks.sqlite3"
PURGE_EVERY = 256  # a long-lived process (distbrake serve) deletes expired records every this many steps

_SCHEMA = """
CREATE TABLE IF NOT EXISTS streaks (
    prefix TEXT NOT NULL,
    session TEXT NOT NULL,
    digest TEXT NOT NULL,
    count INTEGER NOT NULL,
    call_id TEXT,
    previous_id TEXT,
    tool TEXT NOT NULL,
    result BLOB,
    ring TEXT,
    cycles TEXT,
    updated REAL NOT NULL,
    expires REAL NOT NULL,
    max_repeats INTEGER,
    warn_at INTEGER,
    enforce INTEGER,
    ladder TEXT,
    PRIMARY KEY (prefix, session)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS streaks_expires ON streaks (expires);
CREATE TABLE IF NOT EXISTS switches (
    prefix TEXT NOT NULL PRIMARY KEY,
    halt TEXT NOT NULL,
    expires REAL
) WITHOUT ROWID;
"""
# The kill switch of a prefix (`block_all`): one row of `switches` while it is set; `expires` NULL: no expiry.
_KILL = "SELECT halt, expires FROM switches WHERE prefix = ? AND (expires IS NULL OR expires > ?)"
_COLUMNS = (
    "digest, count, call_id, previous_id, tool, result, ring, cycles, updated, expires, max_repeats, warn_at, enforce,"
    " ladder"
)


def _storable(text: str) -> str:
    """`text` as SQLite can store it: a lone surrogate (valid in a Python str and in JSON, not in UTF-8) is
    kept as the backslash escapes of its bytes, so such an id is stored, never fails the transaction."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "backslashreplace")
    return text


def _storable_id(text: str | None) -> str | None:
    return None if text is None else _storable(text)


def default_path() -> str:
    """`$XDG_CACHE_HOME/distbrake/streaks.sqlite3`, else `~/.cache/distbrake/streaks.sqlite3`."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "distbrake", FILE_NAME)


class Row(NamedTuple):
    """A session's record as `inspect` shows it (never the arguments)."""

    session: str
    tool: str
    digest: str
    count: int  # type: ignore[assignment]  # the field shadows tuple.count on purpose
    updated: float  # Unix time of the last check
    expires: float  # Unix time the record is forgotten
    rules: Rules | None
    halt: Halt | None = None  # the session is halted


class StreakFile:
    """The streak records of one file, stepped atomically across processes (see the module's doc)."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, timeout: float = DEFAULT_TIMEOUT,
        ttl: float = DEFAULT_TTL, prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.path = os.fspath(path) if path is not None else default_path()  # (no pathlib: start-up time)
        self.timeout = timeout  # longest wait for the file's lock; also the replay window, as in Redis
        self.ttl = ttl
        self.prefix = prefix
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._steps = 0  # one transaction at a time on the connection (a server's threads share it)

    def __repr__(self) -> str:
        return f"StreakFile({self.path!r})"

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            if not os.path.exists(self.path):
                with contextlib.suppress(FileExistsError):
                    os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            try:
                db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
                if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = NORMAL")
                if db.execute("SELECT count(*) FROM sqlite_master WHERE name IN ('streaks', 'switches')").fetchone()[
                        0] < 2:
                    db.executescript(_SCHEMA)  # a new file, or one of an earlier version (no kill switch)
                elif not any(column[1] == "ladder" for column in db.execute("PRAGMA table_info(streaks)")):
                    with contextlib.suppress(sqlite3.OperationalError):  # another process added it first
                        db.execute("ALTER TABLE streaks ADD COLUMN ladder TEXT")  # a file of an earlier version
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = self._connect()
            db.execute("BEGIN IMMEDIATE")  # the write lock first: the read-step-write is one atomic step
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def step(
        self, session: str, digest: str, call_id: str | None, tool: str, rules: Rules,
        cycles: CycleRule | None = None,
    ) -> Counted:
        """Count one call in `session`'s record (the model's `check`), as `LoopBrake.record`."""
        return self.step_many([(session, digest, call_id, tool, rules)], cycles)[0]

    def step_many(
        self, calls: Sequence[tuple[str, str, str | None, str, Rules]], cycles: CycleRule | None = None,
    ) -> list[Counted]:
        """`step` for each of `calls` (session, digest, call id, tool, rules) in order, in one transaction.

        A server batches the checks that arrive together: one lock and one commit for all of them, each
        counted exactly as alone (a session twice in a batch reads its own first write).
        """
        now = time.time()
        counted = []
        with self._transaction() as db:
            killed = self._kill(db, now)
            if killed is not None:  # the kill switch is set: every check refused, nothing counted or written
                return [Counted(0, halt=killed[0]) for _ in calls]
            for raw_session, digest, raw_call_id, raw_tool, rules in calls:
                session, call_id, tool = _storable(raw_session), _storable_id(raw_call_id), _storable(raw_tool)
                row = db.execute(
                    f"SELECT {_COLUMNS} FROM streaks WHERE prefix = ? AND session = ? AND expires > ?",
                    (self.prefix, session, now),
                ).fetchone()
                streak = Streak() if row is None else _streak(row)
                fresh = row is not None and now - row[8] <= self.timeout
                one = check(streak, digest, call_id, tool, fresh, rules, cycles, lambda: now)
                counted.append(one)
                if one.halt is not None:
                    continue  # a halted session: nothing counted, nothing written, its expiry unchanged
                self._write(db, session, streak, now, now + self.ttl, rules)
            self._steps += 1
            if self._steps % PURGE_EVERY == 1:  # expired records go now and then (the first step of each process)
                db.execute("DELETE FROM streaks WHERE expires <= ?", (now,))
        return counted

    def _write(
        self, db: sqlite3.Connection, session: str, streak: Streak, updated: float, expires: float, rules: Rules | None,
    ) -> None:
        db.execute(
            f"INSERT OR REPLACE INTO streaks (prefix, session, {_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.prefix, session, streak.digest, streak.count, streak.call_id, streak.previous_id,
                streak.tool_name, streak.result, None if streak.ring is None else orjson.dumps(streak.ring),
                orjson.dumps(streak.cycles), updated, expires, None if rules is None else rules.max_repeats,
                None if rules is None else rules.warn_at, None if rules is None else int(rules.enforce),
                _ladder_text(streak),
            ),
        )

    def fail(self, session: str, tool: str, call_id: str | None, failed: bool) -> None:
        """Record whether a call of `tool` failed (the model's `fail`, max_failures)."""
        now = time.time()
        session, tool, call_id = _storable(session), _storable(tool), _storable_id(call_id)
        with self._transaction() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM streaks WHERE prefix = ? AND session = ? AND expires > ?",
                (self.prefix, session, now),
            ).fetchone()
            if row is not None:
                streak = _streak(row)
                fail(streak, tool, call_id, failed)
                db.execute(
                    "UPDATE streaks SET ladder = ? WHERE prefix = ? AND session = ?",
                    (_ladder_text(streak), self.prefix, session),
                )

    def observe(self, session: str, digest: str, call_id: str | None, result: bytes) -> int:
        """Record a progress-aware call's result digest (the model's `observe`): 2 restarted, 1 recorded, 0 ignored."""
        now = time.time()
        session, call_id = _storable(session), _storable_id(call_id)
        with self._transaction() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM streaks WHERE prefix = ? AND session = ? AND expires > ?",
                (self.prefix, session, now),
            ).fetchone()
            if row is None:
                return 0
            streak = _streak(row)
            outcome = observe(streak, digest, call_id, result)
            if outcome:
                db.execute(
                    "UPDATE streaks SET count = ?, previous_id = ?, result = ? WHERE prefix = ? AND session = ?",
                    (streak.count, streak.previous_id, streak.result, self.prefix, session),
                )
        return outcome

    def rows(self, session: str | None = None) -> list[Row]:
        """The live records (of `session` only, when given)."""
        now = time.time()
        query = f"SELECT session, {_COLUMNS} FROM streaks WHERE prefix = ? AND expires > ?"
        params: tuple[object, ...] = (self.prefix, now)
        if session is not None:
            query += " AND session = ?"
            params += (_storable(session),)
        found = []
        with self._lock:
            selected = self._connect().execute(query, params).fetchall()
        for row in selected:
            rules = None if row[11] is None else Rules(row[11], row[12], bool(row[13]))
            found.append(Row(row[0], row[5], row[1], row[2], row[9], row[10], rules, _ladder(row[14]).halt))
        return found

    # -- the operator's stop (operator.py) -------------------------------------------------------------------

    def block(self, session: str, halt: Halt, ttl: float) -> None:
        """Halt `session` for `ttl` seconds (an operator's block): a record is made when it has none."""
        now = time.time()
        session = _storable(session)
        with self._transaction() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM streaks WHERE prefix = ? AND session = ? AND expires > ?",
                (self.prefix, session, now),
            ).fetchone()
            streak = Streak() if row is None else _streak(row)
            streak.halt = halt
            if row is None:
                self._write(db, session, streak, now, now + ttl, None)
            else:
                db.execute("UPDATE streaks SET ladder = ?, expires = ? WHERE prefix = ? AND session = ?",
                           (_ladder_text(streak), now + ttl, self.prefix, session))

    def unblock(self, session: str) -> bool:
        """Lift `session`'s halt: its record is deleted; False when it is not halted."""
        now = time.time()
        session = _storable(session)
        with self._transaction() as db:
            row = db.execute("SELECT ladder FROM streaks WHERE prefix = ? AND session = ? AND expires > ?",
                             (self.prefix, session, now)).fetchone()
            if row is None or _ladder(row[0]).halt is None:
                return False
            db.execute("DELETE FROM streaks WHERE prefix = ? AND session = ?", (self.prefix, session))
            return True

    def _kill(self, db: sqlite3.Connection, now: float) -> tuple[Halt, float | None] | None:
        row = db.execute(_KILL, (self.prefix, now)).fetchone()
        return None if row is None else (Halt(*orjson.loads(row[0])), row[1])

    def kill(self) -> tuple[Halt, float | None] | None:
        """The kill switch of this prefix: its halt and when it expires (Unix time; None: never), or None."""
        with self._lock:
            return self._kill(self._connect(), time.time())

    def set_kill(self, halt: Halt, ttl: float | None) -> None:
        """Set the kill switch: every check of this prefix is refused (`ttl` seconds; None: until lifted)."""
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO switches (prefix, halt, expires) VALUES (?, ?, ?)",
                       (self.prefix, orjson.dumps(list(halt)).decode(), None if ttl is None else time.time() + ttl))

    def clear_kill(self) -> bool:
        """Lift the kill switch; True when it was set."""
        with self._transaction() as db:
            set_now = self._kill(db, time.time()) is not None
            db.execute("DELETE FROM switches WHERE prefix = ?", (self.prefix,))
            return set_now

    def clear(self, session: str) -> bool:
        """Forget `session`'s record; True when there was one."""
        with self._transaction() as db:
            done = db.execute("DELETE FROM streaks WHERE prefix = ? AND session = ?",
                              (self.prefix, _storable(session)))
            return done.rowcount > 0


def _streak(row: tuple[Any, ...]) -> Streak:
    digest, count, call_id, previous_id, tool, result, ring, cycles = row[:8]
    last, previous = orjson.loads(cycles) if cycles else (0, 0)
    streak = _ladder(row[13])
    streak.digest, streak.count, streak.call_id, streak.previous_id, streak.tool_name = (
        str(digest), int(count), _text(call_id), _text(previous_id), str(tool))
    streak.result = result if isinstance(result, bytes) else None
    streak.ring = None if ring is None else [(str(a), str(b)) for a, b in orjson.loads(ring)]
    streak.cycles = (int(last), int(previous))
    return streak


def _ladder_text(streak: Streak) -> str | None:
    """The ladder's state of `streak` as the column `ladder` keeps it (JSON; None when there is none)."""
    state: dict[str, Any] = {}
    if streak.halt is not None:
        state["halt"] = list(streak.halt)
    if streak.once:
        state["once"] = streak.once
    if streak.failures:
        state["failures"] = streak.failures
    if streak.calls:
        state["calls"] = streak.calls
    return orjson.dumps(state).decode() if state else None


def _ladder(text: object) -> Streak:
    """A `Streak` holding only the ladder's state of a `ladder` column."""
    streak = Streak()
    if not isinstance(text, str) or not text:
        return streak
    state = orjson.loads(text)
    if "halt" in state:
        streak.halt = Halt(*state["halt"])
    if "once" in state:
        streak.once = [(str(p), _text(i), int(t)) for p, i, t in state["once"]]
    if "failures" in state:
        streak.failures = {str(k): (int(n), _text(i)) for k, (n, i) in state["failures"].items()}
    if "calls" in state:
        streak.calls = {str(k): int(n) for k, n in state["calls"].items()}
    return streak


def _text(value: object) -> str | None:
    return None if value is None else str(value)
