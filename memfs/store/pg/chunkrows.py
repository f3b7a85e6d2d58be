"""Chunk rows in PostgreSQL stored whole or as patches (memfs.store.delta): the statements that
read them back through what they are read through, and what a host knows of a row's form.

A row whose `over` is set holds a patch; `over` names a whole base, then the patches between
it and this one, oldest first (a flat list: each of those is the base or a patch whose own
`over` is a prefix of it). Reading one takes the row and the rows it names in one statement,
so one snapshot and one round trip, and the bytes are rebuilt by delta.assemble, the embedded
store's function.

No state: statements and pure functions, called by the store's reader (any thread) and the
commit thread (memfs.store.pg.tx).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memfs.store import delta

# The rows asked for (first column true), then the rows they are read through: %s twice,
# each an array of ids.
CHUNKS_SQL = ("SELECT true, id, over, data FROM chunks WHERE id = ANY(%s) UNION ALL "
              "SELECT false, p.id, NULL, p.data FROM chunks c JOIN chunks p "
              "ON p.id = ANY(string_to_array(c.over, ' ')) WHERE c.id = ANY(%s)")
# The same on a store from before patches (schema 5, opened read-only: not migrated).
WHOLE_SQL = "SELECT true, id, NULL, data FROM chunks WHERE id = ANY(%s) AND id = ANY(%s)"

# Each row's form: its id, `over`, the bytes of the patches a read of it applies (its own
# and those between: what delta.encode weighs), and whether every row it names is there.
FORMS_SQL = (
    "SELECT c.id, c.over, (CASE WHEN c.over IS NULL THEN 0 ELSE octet_length(c.data) + "
    "COALESCE((SELECT sum(octet_length(p.data)) FROM chunks p "
    "WHERE p.id = ANY((string_to_array(c.over, ' '))[2:])), 0) END)::bigint, "
    "c.over IS NULL OR (SELECT count(*) FROM chunks p WHERE p.id = "
    "ANY(string_to_array(c.over, ' '))) = cardinality(string_to_array(c.over, ' ')) "
    "FROM chunks c WHERE c.id = ANY(%s)")


@dataclass(frozen=True)
class ChunkForm:
    """How a chunk row is stored: `over` (what it is read through; () whole) and `patched`,
    the bytes of the patches a read of it applies (its own and those between)."""

    over: tuple[str, ...]
    patched: int

    def after(self, blob: bytes, over: tuple[str, ...]) -> ChunkForm:
        """The form of a patch `blob` over `over`, made from a chunk of this form (over it
        and what it is read through, or over its base alone)."""
        return ChunkForm(over, self.patched + len(blob) if len(over) > 1 else len(blob))


WHOLE = ChunkForm((), 0)


def rebuilt(rows: Iterable[tuple]) -> dict[str, bytes | KeyError]:
    """The chunks a CHUNKS_SQL statement asked for, by id: their bytes, or the KeyError that
    says what a patch lacks."""
    own: list[tuple[str, str | None, bytes]] = []
    stored: dict[str, bytes] = {}
    for asked, cid, over, data in rows:
        if asked:
            own.append((cid, over, bytes(data)))
        else:
            stored[cid] = bytes(data)
    out: dict[str, bytes | KeyError] = {}
    for cid, over, data in own:
        try:
            out[cid] = delta.assemble(cid, data, delta.split_over(over), stored)
        except KeyError as exc:
            out[cid] = exc
    return out
