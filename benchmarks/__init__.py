"""memfs benchmarks: named workloads run on a native directory and on a memfs mount.

`scripts/bench` is the entry point; `workloads.py` holds the registry (add a group, such as
`reconcile`, by decorating functions with `@workload(...)` in a module listed in `run.MODULES`).
"""
