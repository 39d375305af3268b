"""hostmgr/sim: the sim backend (hosts and tasks that exist only in memory, for scale tests and benchmarks)."""
