"""Fixtures shared by the whole test tree (core and plugin packages)."""
