"""The Postgres store's held writes as one statement: parameters renumbered, or written as
literals for the simple protocol (no server needed)."""

from __future__ import annotations

from runtime.storage.sql.postgres import _held_statement, _literal_statement, _renumber, _table


def test_held_writes_become_one_statement_with_renumbered_parameters() -> None:
    held = [
        ("UPDATE runs SET status = $2 WHERE id = $1", ("r1", "done")),
        ("UPDATE threads SET version = version + 1, updated_at = $2 WHERE id = $1", ("t1", 2.5)),
    ]
    statement, values = _held_statement(held)
    assert statement == (
        "WITH held_0 AS (UPDATE runs SET status = $2 WHERE id = $1) "
        "UPDATE threads SET version = version + 1, updated_at = $4 WHERE id = $3"
    )
    assert values == ["r1", "done", "t1", 2.5]
    assert _renumber("SELECT $1, $10, $2", 9) == "SELECT $10, $19, $11"
    assert _table("  update runs SET x = $1") == "runs" and _table("SELECT 1") is None


def test_literal_statement_writes_each_parameter_in_place() -> None:
    held = [
        (
            "INSERT INTO t (a, b, c, d, e, f, g, h, i, j) VALUES "
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            (*range(9), "it's"),
        ),
        ("UPDATE u SET a = $1, b = $2, c = $3 WHERE id = $4", (None, True, 1.5, "x")),
    ]
    assert _literal_statement(held, True) == (
        "WITH held_0 AS (INSERT INTO t (a, b, c, d, e, f, g, h, i, j) VALUES "
        "('0', '1', '2', '3', '4', '5', '6', '7', '8', 'it''s')) "
        "UPDATE u SET a = NULL, b = 'true', c = '1.5' WHERE id = 'x'"
    )
    # A value without a literal, or strings not standard-conforming: parameters instead.
    assert _literal_statement([("UPDATE u SET a = $1", (b"bytes",))], True) is None
    assert _literal_statement(held, False) is None
