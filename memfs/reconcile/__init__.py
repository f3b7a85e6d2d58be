"""The backing-disk reconciler: observe -> decide -> effect, with evidence in the journal.

See docs/reconciliation.md. Pure parts: rule (the three-way rule), intent (branch intent bytes),
plan (pass, sync, materialize, status). Disk parts: observe, effects, contained. Write-ahead
over the journal (memfs.store.journal): apply.
"""
