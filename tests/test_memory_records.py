"""Record validation and Markdown normalization: the rules every write goes through."""

from __future__ import annotations

import pytest

from memfs.memory.errors import InvalidRecord
from memfs.memory.records import (
    MAX_GLOBAL_BYTES,
    MAX_RECORD_BYTES,
    normalize_global_content,
    normalize_markdown,
    normalize_record_content,
    record_name_from_filename,
    validate_name,
    validate_workspace,
)


@pytest.mark.parametrize("name", [
    "", "a/b", "a\\b", "..", "a..b", ".hidden", "x\x00y", "tab\there", "nl\nx", " pad",
    "pad ", "index", "INDEX", "notes.md", "a" * 101, "é" * 121, "rtl\u202eevil", "zw\u200bj",
    "line\u2028sep", 7, None, b"bytes",
])
def test_unsafe_names_are_refused(name: object) -> None:
    with pytest.raises(InvalidRecord):
        validate_name(name)


@pytest.mark.parametrize("name", ["editor-preferences", "a", "Notes 2024", "café", "x" * 100,
                                  "with.dot", "日本語"])
def test_safe_names_pass(name: str) -> None:
    assert validate_name(name) == name


def test_names_are_nfc_normalized() -> None:
    decomposed = "cafe\u0301"
    assert validate_name(decomposed) == "caf\u00e9"


def test_record_file_names_map_to_names() -> None:
    assert record_name_from_filename("editor.md") == "editor"
    for bad in ("editor.txt", ".md", "index.md", ".editor.md.swp", "a/b.md"):
        with pytest.raises(InvalidRecord):
            record_name_from_filename(bad)


@pytest.mark.parametrize(("raw", "norm"), [
    ("# T\r\n- a  \r\n", "# T\n- a\n"),
    ("# T\r- a", "# T\n- a\n"),
    ("\n\n# T\n\n\n\n", "# T\n"),
    ("a\t \nb", "a\nb\n"),
    ("a\n\n\nb\n", "a\n\n\nb\n"),
    ("   \n\t\n", ""),
    ("", ""),
])
def test_markdown_normalization(raw: str, norm: str) -> None:
    assert normalize_markdown(raw) == norm
    assert normalize_markdown(norm) == norm


def test_content_caps_and_controls() -> None:
    assert normalize_record_content("x" * (MAX_RECORD_BYTES - 1)) == "x" * (MAX_RECORD_BYTES - 1) + "\n"
    with pytest.raises(InvalidRecord, match="cap"):
        normalize_record_content("x" * MAX_RECORD_BYTES)
    with pytest.raises(InvalidRecord, match="cap"):
        normalize_global_content("é" * (MAX_GLOBAL_BYTES // 2 + 1))
    with pytest.raises(InvalidRecord, match="empty"):
        normalize_record_content(" \n\n")
    with pytest.raises(InvalidRecord, match="U\\+0007"):
        normalize_record_content("bell \x07")
    with pytest.raises(InvalidRecord, match="Unicode"):
        normalize_record_content("lone \udc80")
    assert normalize_global_content("") == ""


@pytest.mark.parametrize("ws", ["", ".memfs", "a/b", "..", "x\ny", 3])
def test_unsafe_workspace_names_are_refused(ws: object) -> None:
    with pytest.raises(InvalidRecord):
        validate_workspace(ws)
