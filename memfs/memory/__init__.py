"""Agent memory: Global and per-workspace Markdown generations, sessions, one preview.

Entry points: `store.MemoryStore` (reads and compare-and-swap commits), `preview`
(the pure generation algorithm), `sessions.SessionStore` (append-only turns, freeze,
evidence projection). See docs/memory.md.
"""
