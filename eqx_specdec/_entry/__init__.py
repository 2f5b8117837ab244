"""The one entry point, `verify`, and its result."""
