"""Contracts every stage shares: errors, table schemas, run directories, the store,
atomic writes and collective names.  Stages import from here; this package imports no stage."""
