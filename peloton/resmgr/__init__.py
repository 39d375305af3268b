"""Resource manager: the pool tree, admission of whole gangs against pool limits, and the priority queue."""
