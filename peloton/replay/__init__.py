"""Trace replay: public traces run through the real scheduler on the sim backend, and what users would feel."""
