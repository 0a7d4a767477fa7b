"""The OpenAI-compatible model client: its settings, the endpoint, the wire format."""
