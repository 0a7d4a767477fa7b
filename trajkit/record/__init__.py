"""The trajectory record and its formats: the record model and the schemas derived from it, the
writer, filter and scorer contracts, and the scrubbing of the run's secrets."""
