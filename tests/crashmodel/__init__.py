"""A crash model that keeps only what was synced: an LD_PRELOAD shim logs a process's file
I/O under one directory, and a replayer rebuilds what a power cut at any point could leave."""
