"""A run: the dataset planned into work items, each executed (one attempt at a time) by an executor,
recorded in the run directory's ledger, and finalized into the outputs."""
