"""trajkit environments for Atropos (see ``docs/atropos.md``)."""
