import os


# Eight host CPU devices, for the sharding tests (set before JAX starts its backend; the
# other tests run on the default device, as before).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import jax  # noqa: E402


# Strict promotion catches silent dtype and rank mixing (int64 with int32, float64 with
# float32) in the library. `JAX_ENABLE_X64` chooses the mode; CI runs both.
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
