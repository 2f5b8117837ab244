"""The contract's signatures for logits, a key and trees, over `eqx_specdec.verify`:
what a user writes who wants arrays in and the contract's dict out (the library has
one entry point, `verify`, and `speculative_accept` for probabilities)."""

import eqx_specdec


def accept_logits(
    draft_tokens,
    draft_logits,
    target_logits,
    accept_uniforms,
    sample_uniforms,
    *,
    target_warp=eqx_specdec.Warp(),
    draft_warp=eqx_specdec.Warp(),
    parents=None,
    **kwargs,
):
    q = None if draft_logits is None else eqx_specdec.Logits(draft_logits, draft_warp)
    return eqx_specdec.verify(
        eqx_specdec.Logits(target_logits, target_warp),
        eqx_specdec.Draft(draft_tokens, q, parents),
        eqx_specdec.Uniforms(accept_uniforms, sample_uniforms),
        **kwargs,
    ).as_dict()


def accept_from_key(key, draft_tokens, draft_probs, target_probs, **kwargs):
    q = None if draft_probs is None else eqx_specdec.Probabilities(draft_probs)
    return eqx_specdec.verify(
        eqx_specdec.Probabilities(target_probs),
        eqx_specdec.Draft(draft_tokens, q),
        key,
        **kwargs,
    ).as_dict()


def tree_accept(
    node_tokens,
    parents,
    draft_probs,
    target_probs,
    accept_uniforms,
    sample_uniforms,
    *,
    verifier=None,
    **kwargs,
):
    q = None if draft_probs is None else eqx_specdec.Probabilities(draft_probs)
    return eqx_specdec.verify(
        eqx_specdec.Probabilities(target_probs),
        eqx_specdec.Draft(node_tokens, q, parents),
        eqx_specdec.Uniforms(accept_uniforms, sample_uniforms),
        verifier=eqx_specdec.TreeVerifier() if verifier is None else verifier,
        **kwargs,
    ).as_dict()


def tree_accept_logits(node_tokens, parents, *arrays, verifier=None, **kwargs):
    verifier = eqx_specdec.TreeVerifier() if verifier is None else verifier
    return accept_logits(
        node_tokens, *arrays, parents=parents, verifier=verifier, **kwargs
    )
