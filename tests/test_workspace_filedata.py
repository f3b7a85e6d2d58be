"""FileData against a plain bytearray: writes, truncates and commits at chunk boundaries.

Chunks are shrunk to 16 bytes here (the logic is the same at 1 MiB) so that short random
operations cross boundaries, leave holes and rewrite committed pieces.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from memfs.workspace import nodes

SMALL = 16

ops = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 80), st.binary(min_size=1, max_size=40)),
        st.tuples(st.just("truncate"), st.integers(0, 100), st.just(b"")),
        st.tuples(st.just("commit"), st.just(0), st.just(b"")),
    ),
    max_size=25,
)


def _commit(fd: nodes.FileData, store: dict[str, bytes]) -> None:
    """What a group commit does to a file: dirty pieces become stored chunks."""
    for idx, piece in list(fd.dirty.items()):
        cid = f"c{len(store)}"
        store[cid] = bytes(piece)
        fd.committed(idx, cid)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_filedata_matches_a_bytearray(sequence):
    old = nodes.CHUNK_SIZE
    nodes.CHUNK_SIZE = SMALL
    try:
        store: dict[str, bytes] = {}

        def fetch(cid: str, start: int, length: int) -> bytes:
            return store[cid][start:start + length]

        fd = nodes.FileData()
        model = bytearray()
        for op, n, data in sequence:
            if op == "write":
                if len(model) < n:
                    model.extend(bytes(n - len(model)))
                model[n:n + len(data)] = data
                fd.write(n, data, fetch)
            elif op == "truncate":
                if n < len(model):
                    del model[n:]
                else:
                    model.extend(bytes(n - len(model)))
                fd.truncate(n, fetch)
            else:
                _commit(fd, store)
            assert fd.size == len(model)
            assert fd.read(0, len(model) + 10, fetch) == bytes(model)
            for i in range(0, len(model), 7):
                assert fd.read(i, 9, fetch) == bytes(model[i:i + 9])
    finally:
        nodes.CHUNK_SIZE = old
