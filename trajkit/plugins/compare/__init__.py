"""``trajkit compare``: runs side by side, in the terminal and as an HTML page."""
