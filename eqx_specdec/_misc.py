import jax.numpy as jnp
import numpy as np


def compute_dtype(*dtypes) -> np.dtype:
    """The float dtype arithmetic runs in: the widest input float, and at least float32.

    Written by hand because `jnp.promote_types` refuses float32 with float64 under
    `jax_numpy_dtype_promotion="strict"`, which users may have switched on.
    """
    widest = max((np.dtype(d) for d in dtypes), key=lambda d: d.itemsize)
    if widest.itemsize > 4:
        return np.dtype(jnp.float64)
    return np.dtype(jnp.float32)
