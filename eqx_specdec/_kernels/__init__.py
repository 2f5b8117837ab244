"""Pallas kernels: backend forms of a stage's pass, each a pure function of arrays that
the stage owning the pass calls where the backend rewards it."""
