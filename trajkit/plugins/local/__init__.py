"""The local sandbox backend: a directory of the host, commands confined by bubblewrap and cgroups."""
