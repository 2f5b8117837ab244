"""The logits warps (temperature, top-k, top-p, min-p, penalties, a logit bias) and the exact cut-off searches they run."""
