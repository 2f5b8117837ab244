"""The four stage families and their implementations."""
