import jax


# Strict promotion catches silent dtype and rank mixing (int64 with int32, float64 with
# float32) in the library. `JAX_ENABLE_X64` chooses the mode; CI runs both.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
