"""The PostgreSQL backend: one store shared by many hosts (memfs.store.backend)."""
