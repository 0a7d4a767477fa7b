"""The browser toolset: a headless Chromium driven by Playwright, reached through a filtering proxy."""
