"""Settings: the models plugins declare, the core's run configuration, their resolution (flags over
environment over file over defaults) and the command-line options made from them."""
