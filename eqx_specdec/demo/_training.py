"""Training the built-in transformers on the built-in text (Adam, next-token
cross-entropy), and loading the pair that ships with the package."""

import functools
import importlib.resources
import pathlib
import typing

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PRNGKeyArray

from ._corpus import builtin_corpus, VOCABULARY
from ._transformer import Transformer


class _Builtin(typing.NamedTuple):
    """One shipped transformer: its file, `Transformer.init` settings and training."""

    filename: str
    dim: int
    depth: int
    heads: int
    steps: int
    batch: int
    window: int
    learning_rate: float
    seed: int

    def settings(self) -> dict:
        return dict(dim=self.dim, depth=self.depth, heads=self.heads)

    def training(self) -> dict:
        return dict(
            steps=self.steps,
            batch=self.batch,
            window=self.window,
            learning_rate=self.learning_rate,
        )


# The shipped pair. The target is wide for its depth so that on a CPU its call costs
# about the same for one token as for four (reading its weights dominates), as a large
# model's does on an accelerator.
_TARGET = _Builtin("transformer-target.eqx", 320, 3, 8, 200, 16, 64, 2e-3, 0)
_DRAFT = _Builtin("transformer-draft.eqx", 64, 1, 4, 300, 16, 64, 3e-3, 1)
# Shipped weights are stored in float16 (half the bytes) and loaded as float32.
_STORED = jnp.float16


def train_transformer(
    tokens,
    key: PRNGKeyArray,
    *,
    vocab_size: int,
    dim: int = 64,
    depth: int = 2,
    heads: int = 4,
    context: int = 256,
    steps: int = 300,
    batch: int = 32,
    window: int = 128,
    learning_rate: float = 3e-3,
) -> tuple[Transformer, np.ndarray]:
    """Trains a [`eqx_specdec.demo.Transformer`][] on a token sequence: next-token
    cross-entropy on random windows, Adam with a linear warm-up and cosine decay,
    gradients clipped to norm 1. Deterministic given `key` (on one backend).

    **Arguments:**

    - `tokens`: a 1-d sequence of integer ids in `[0, vocab_size)`, longer than
        `window`.
    - `key`: a `jax.random` key (the initial weights and the windows).
    - `vocab_size`, `dim`, `depth`, `heads`, `context`: as for `Transformer.init`.
    - `steps`, `batch`, `window`: the Adam steps, the windows per step and their
        length.
    - `learning_rate`: the peak learning rate.

    **Returns:**

    `(model, losses)`: the trained model and the loss (nats per token) at each step.
    """
    data = jnp.asarray(np.asarray(tokens, np.int32).ravel())
    if data.shape[0] <= window:
        raise ValueError(
            f"`tokens` must be longer than `window` = {window}; got {data.shape[0]}."
        )
    init_key, data_key = jax.random.split(key)
    model = Transformer.init(
        init_key,
        vocab_size=vocab_size,
        dim=dim,
        depth=depth,
        heads=heads,
        context=context,
    )
    params, static = eqx.partition(model, eqx.is_inexact_array)
    moments = jax.tree.map(jnp.zeros_like, (params, params))

    def loss_fn(params, windows):
        model = eqx.combine(params, static)
        logits = jax.vmap(model.logits)(windows[:, :-1])
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(log_probs, windows[:, 1:, None], axis=-1)
        return -jnp.mean(picked)

    def rate(step):
        warm = jnp.minimum(1.0, (step + 1) / 20)
        return learning_rate * warm * 0.5 * (1 + jnp.cos(jnp.pi * step / steps))

    def as_float(step):
        return jnp.asarray(step, jnp.float32)

    @jax.jit
    def update(carry, step):
        params, (m, v) = carry
        starts = jax.random.randint(
            jax.random.fold_in(data_key, step), (batch,), 0, data.shape[0] - window
        )
        windows = jax.vmap(lambda s: jax.lax.dynamic_slice_in_dim(data, s, window + 1))(
            starts
        )
        loss, grads = jax.value_and_grad(loss_fn)(params, windows)
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        grads = jax.tree.map(lambda g: g / jnp.maximum(norm, 1.0), grads)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        t = as_float(step) + 1
        lr = rate(as_float(step))

        def adam(p, m, v):
            m_hat = m / (1 - 0.9**t)
            v_hat = v / (1 - 0.999**t)
            return p - lr * m_hat / (jnp.sqrt(v_hat) + 1e-8)

        params = jax.tree.map(adam, params, m, v)
        return (params, (m, v)), loss

    (params, _), losses = jax.lax.scan(
        update, (params, moments), jnp.arange(steps, dtype=jnp.int32)
    )
    return eqx.combine(params, static), np.asarray(losses)


def _data_dir() -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files("eqx_specdec.demo") / "data"))


def _train_builtin(spec: _Builtin) -> Transformer:
    model, _ = train_transformer(
        builtin_corpus(),
        jax.random.key(spec.seed),
        vocab_size=len(VOCABULARY),
        **spec.settings(),
        **spec.training(),
    )
    return _cast(model, _STORED)


def _cast(model, dtype):
    return jax.tree.map(
        lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, model
    )


def write_builtin_transformers(directory) -> list[pathlib.Path]:
    """Trains the built-in transformer pair on the built-in text and writes their weights
    (what `python -m eqx_specdec train-transformers --out DIR` runs; the files shipped
    with the package were written by it, into `eqx_specdec/demo/data` of a checkout).

    **Arguments:**

    - `directory`: where to write (required: nothing is written inside an installed
        package unless you name its directory).

    **Returns:**

    The paths written.
    """
    if directory is None:
        raise TypeError(
            "write_builtin_transformers(`directory`=...) is required: where to write "
            "the weights (eqx_specdec/demo/data in a checkout, to refresh the shipped "
            "files)."
        )
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in (_DRAFT, _TARGET):
        path = directory / spec.filename
        eqx.tree_serialise_leaves(path, _train_builtin(spec))
        paths.append(path)
    return paths


@functools.lru_cache(maxsize=1)
def builtin_transformers() -> tuple[Transformer, Transformer]:
    """The built-in transformer pair, trained on the built-in text
    ([`eqx_specdec.demo.builtin_corpus`][]) over [`eqx_specdec.demo.VOCABULARY`][]: a draft of
    one layer of width 64 (53 thousand weights) and a target of three layers of width
    320 (3.7 million), each holding 256 positions. Loaded once (a cache of one entry)
    from the weights shipped with the package (written by `python -m eqx_specdec
    train-transformers --out DIR`). An installation without them raises
    `FileNotFoundError` naming that command: nothing is trained on load.

    **Returns:**

    `(draft_model, target_model)`, two [`eqx_specdec.demo.Transformer`][]s returning
    logits.
    """
    models = []
    for spec in (_DRAFT, _TARGET):
        path = _data_dir() / spec.filename
        if not path.exists():
            raise FileNotFoundError(
                f"The built-in transformer weights are missing from this installation "
                f"({path}). Write them with `python -m eqx_specdec train-transformers "
                f"--out {path.parent}` (about a minute on 2 CPU cores), or reinstall "
                "the package with its data."
            )
        # The model's structure alone, as shapes (running the initialiser op by op
        # took 3.5 s of the demo's time), in the stored dtype.
        like = eqx.filter_eval_shape(
            Transformer.init,
            jax.random.key(0),
            vocab_size=len(VOCABULARY),
            **spec.settings(),
        )
        like = jax.tree.map(
            lambda a: (
                jax.ShapeDtypeStruct(a.shape, _STORED)
                if isinstance(a, jax.ShapeDtypeStruct)
                and jnp.issubdtype(a.dtype, jnp.inexact)
                else a
            ),
            like,
        )
        model = eqx.tree_deserialise_leaves(path, like)
        models.append(_cast(model, jnp.float32))
    return models[0], models[1]
