"""Contracts every stage shares: errors, table schemas, strict contract readers, run
directories, the store, atomic writes (the only implementation), collective names,
where the bundled data lives (``bundled``) and the one HTA adapter (``hta``, optional,
imported lazily).  Stages import from here; this package imports no stage."""
