"""Shared helpers for the real-mount tests: the daemon's lifecycle, tree snapshots, fixtures'
data generators and the crash workload. Imported as `helpers.*` (pytest puts tests/ on sys.path).
"""
