"""``trajkit report``: one run's statistics as a self-contained HTML page."""
