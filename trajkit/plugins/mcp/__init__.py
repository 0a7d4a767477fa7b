"""MCP servers as toolsets, through the official MCP SDK."""
