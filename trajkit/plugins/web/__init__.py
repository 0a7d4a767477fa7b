"""The web toolsets: search, page reading, vision and image generation."""
