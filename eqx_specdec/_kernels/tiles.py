"""The TPU's float32 tile, as the kernels lay their rows out in it."""

# Rows one program reads: one per sublane of the TPU's (8, 128) float32 tiles.
ROWS = 8
LANES = 128


def lanes_per_step(vocab: int) -> int:
    """The lanes one step of a pass over `(8, vocab)` rows in VMEM reads: up to eight
    128-lane tiles, dividing the vocabulary (so that no step is short)."""
    tiles = vocab // LANES
    return LANES * next(k for k in (8, 4, 2, 1) if tiles % k == 0)
