"""The file toolset: reading, writing, patching and searching files in the sandbox."""
