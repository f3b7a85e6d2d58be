"""Backing directories: the bridge between the live tree and real directories on disk.

A store mount (a top-level directory of the tree) may be bound to a real directory. A pass
observes it (memfs.reconcile.observe, in a worker thread), decides every path with the
three-way rule on the trio loop from one consistent view — the live tree's content digests S,
the journal's evidence P, this branch's intent and the pending write-ahead intents — and
applies what the decisions take. Materialize writes what disk owes through write-ahead pushes.

Where it sits: driven by the workspace through the hooks it names
(memfs.workspace.hooks.BackingHooks), driving the reconciler (memfs.reconcile) and the store's
journal. Imports: fs -> backing -> workspace -> store/reconcile. The package's owners, and
which thread touches what, are listed in memfs.backing.facade; docs/architecture.md has the
map and the glossary.
"""

from memfs.backing.binding import WATCH_MODES, Binding
from memfs.backing.facade import Backing
from memfs.backing.paths import split_path
from memfs.backing.storeview import ref_digest

__all__ = ["Backing", "Binding", "WATCH_MODES", "ref_digest", "split_path"]
