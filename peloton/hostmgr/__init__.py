"""Host manager: the cluster backend behind one interface, host offers and leases, launch/kill, status events."""
