"""The chain verifier family: its base, the composed verifier and its steps on probabilities and logits, the validation of a chain's arrays, its randomness from a key."""
