"""Record validation and Markdown normalization: the one place that decides what memory holds.

Names become file names (`<name>.md`) under the memory tree and in the mount, so they must be
safe as a single path component everywhere. Content is normalized so that two writes that differ
only in line endings or trailing whitespace are the same memory, with the same revision.
"""

from __future__ import annotations

import unicodedata

from memfs.memory.errors import InvalidRecord

MAX_NAME_CHARS = 100
MAX_NAME_BYTES = 240  # `<name>.md` stays under NAME_MAX (255) in UTF-8
MAX_RECORD_BYTES = 64 * 1024
MAX_GLOBAL_BYTES = 64 * 1024
MAX_INDEX_BYTES = 64 * 1024
RECORD_SUFFIX = ".md"
INDEX_NAME = "index"  # index.md is generated; no record may take its name

_FORBIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def validate_name(name: object) -> str:
    """Return the NFC form of a record name, or raise InvalidRecord saying why."""
    if not isinstance(name, str):
        raise InvalidRecord("a record name must be a string", "give the name as text")
    norm = unicodedata.normalize("NFC", name)
    if not norm:
        raise InvalidRecord("a record name must not be empty", "choose a short name like 'editor'")
    bad = next((c for c in norm if unicodedata.category(c) in _FORBIDDEN_CATEGORIES), None)
    if bad is not None:
        raise InvalidRecord(
            f"record name {norm!r} contains control or format character U+{ord(bad):04X}",
            "use printable characters only",
        )
    if "/" in norm or "\\" in norm:
        raise InvalidRecord(f"record name {norm!r} contains a path separator",
                            "a record name is one file name, without '/' or '\\'")
    if ".." in norm or norm.startswith("."):
        raise InvalidRecord(f"record name {norm!r} starts with '.' or contains '..'",
                            "choose a name that starts with a letter or digit")
    if norm != norm.strip():
        raise InvalidRecord(f"record name {norm!r} has leading or trailing whitespace",
                            "trim the name")
    if len(norm) > MAX_NAME_CHARS or len(norm.encode()) > MAX_NAME_BYTES:
        raise InvalidRecord(f"record name {norm[:40]!r}… is longer than {MAX_NAME_CHARS} characters",
                            "choose a shorter name")
    if norm.casefold() == INDEX_NAME:
        raise InvalidRecord(f"record name {norm!r} is reserved for the generated index",
                            "choose another name")
    if norm.lower().endswith(RECORD_SUFFIX):
        raise InvalidRecord(f"record name {norm!r} ends with {RECORD_SUFFIX}",
                            f"give the name without {RECORD_SUFFIX}; the file gets it")
    return norm


def record_name_from_filename(filename: str) -> str:
    """Map a file name in a workspace memory directory (`<name>.md`) to its record name."""
    if not filename.endswith(RECORD_SUFFIX) or filename == RECORD_SUFFIX:
        raise InvalidRecord(f"{filename!r} is not a memory record file",
                            f"memory records are Markdown files named <name>{RECORD_SUFFIX}")
    return validate_name(filename[: -len(RECORD_SUFFIX)])


def normalize_markdown(text: str) -> str:
    """LF line endings, no trailing whitespace, no trailing blank lines, one final newline.

    Empty (or whitespace-only) text normalizes to "".
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip(" \t\f\v") for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return "\n".join(lines) + "\n" if lines else ""


def _check_text(text: object, what: str, cap: int) -> str:
    if not isinstance(text, str):
        raise InvalidRecord(f"{what} must be text", "give Markdown as a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRecord(f"{what} is not valid Unicode (lone surrogate)",
                            "send UTF-8 text") from exc
    norm = normalize_markdown(unicodedata.normalize("NFC", text))
    bad = next((c for c in norm if c not in "\n\t" and unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise InvalidRecord(f"{what} contains control character U+{ord(bad):04X}",
                            "remove it; memory is plain Markdown")
    size = len(norm.encode())
    if size > cap:
        raise InvalidRecord(f"{what} is {size} bytes, over the {cap}-byte cap",
                            "shorten it or split it into several records")
    return norm


def normalize_record_content(content: object) -> str:
    """Validate and normalize one record's Markdown. An empty record is refused (delete it)."""
    norm = _check_text(content, "record content", MAX_RECORD_BYTES)
    if not norm:
        raise InvalidRecord("record content is empty", "delete the record instead")
    return norm


def normalize_global_content(content: object) -> str:
    """Validate and normalize Global memory. Empty Global is allowed: it is the initial state."""
    return _check_text(content, "Global memory", MAX_GLOBAL_BYTES)


def validate_workspace(workspace: object) -> str:
    """A workspace (mount) name is one safe path component, like a record name."""
    if not isinstance(workspace, str):
        raise InvalidRecord("a workspace name must be a string", "name the mount, e.g. 'work'")
    norm = unicodedata.normalize("NFC", workspace)
    if (not norm or norm.startswith(".") or "/" in norm or "\\" in norm or ".." in norm
            or len(norm) > MAX_NAME_CHARS or norm != norm.strip()
            or any(unicodedata.category(c).startswith(("C", "Z")) and c != " " for c in norm)):
        raise InvalidRecord(f"workspace name {workspace!r} is not a safe directory name",
                            "use the mount's name, e.g. 'work'")
    return norm
