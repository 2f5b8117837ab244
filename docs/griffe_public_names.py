"""A Griffe extension for the API pages: every class base, annotation and default is
shown by its public name, and no inherited boilerplate docstring is shown.

Griffe inspects the imported package (`force_inspection` in `mkdocs.yml`, so that
Equinox's generated `__init__` gives each class its signature), and inspection sees
where each object is defined: `equinox._module._module.Module`, `jaxlib._jax.Array`,
`eqx_specdec._chain.verifier.Verifier`. A reader writes `eqx.Module`, `jax.Array` and
`eqx_specdec.Verifier`, so the pages say that. `object.__init__`'s docstring
("Initialize self. ...") is dropped where a class has no constructor docstring of its
own.
"""

import ast
import re

import griffe

import eqx_specdec


_BOILERPLATE = object.__init__.__doc__
# A one-axis jaxtyping shape, which Griffe would show unquoted (`Float[Array, B]`).
_ONE_AXIS = re.compile(
    r"(\b(?:Float|Int|Integer|Bool|Key|Shaped|UInt|Num)\[[\w.]+, )'?(\w+)'?\]"
)
_PRIVATE = re.compile(r"\beqx_specdec\._\w+(?:\.\w+)*\.(\w+)\b")
_FIXED = (
    (re.compile(r"\b(?:jax\.)?jaxlib\._jax\.Array\b"), "jax.Array"),
    (re.compile(r"\bequinox\._module\._module\.Module\b"), "eqx.Module"),
    (re.compile(r"\bequinox\.Module\b"), "eqx.Module"),
    (re.compile(r"\bbuiltins\."), ""),
    # Shapes as the source writes them: `Float[Array, "k V"]`.
    (re.compile(r"\b(?:jaxtyping\.)?(Float|Int|Integer|UInt|Bool|Key|Num|Real|Shaped|PyTree)"
                r"\[(?:jax\.|numpy\.)?(Array|ArrayLike|ndarray)\b"), r"\1[\2"),
    (re.compile(r"\bjaxtyping\.PyTree\b"), "PyTree"),
)  # fmt: skip


def public_name(text: str) -> str:
    """The annotation or base `text` with every private path replaced by its public one."""
    for pattern, replacement in _FIXED:
        text = pattern.sub(replacement, text)

    def _public(match: re.Match) -> str:
        name = match.group(1)
        return f"eqx_specdec.{name}" if hasattr(eqx_specdec, name) else name

    return _PRIVATE.sub(_public, text)


def _expression(value, parent):
    # The value itself where it names nothing private (it keeps its links), else the
    # public text, parsed back into an expression where it parses.
    text = None if value is None else public_name(str(value))
    if text is not None and _ONE_AXIS.search(text):
        # As text: an expression would drop the quotes.
        return _ONE_AXIS.sub(r'\1"\2"]', text)
    if text is None or text == str(value):
        return value
    if isinstance(value, str):
        return text
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    return griffe.safe_get_expression(node, parent=parent) or text


def _public_bases(cls: griffe.Class) -> list[str]:
    # A private base (`_TopPlusOne`) is shown as its own bases, up to public classes.
    runtime = getattr(eqx_specdec, cls.name, None)
    if not isinstance(runtime, type) or not runtime.__module__.startswith(
        "eqx_specdec"
    ):
        return [public_name(str(base)) for base in cls.bases]
    bases, stack = [], list(runtime.__bases__)
    while stack:
        base = stack.pop(0)
        if base.__name__.startswith("_"):
            stack[:0] = base.__bases__
        elif base not in bases:
            bases.append(base)
    return [public_name(f"{base.__module__}.{base.__qualname__}") for base in bases]


class PublicNames(griffe.Extension):
    """Rewrites each object's bases, annotations and defaults to public names."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        seen = set()
        self._visit(pkg, seen)

    def _visit(self, obj, seen: set) -> None:
        if obj.is_alias or id(obj) in seen:
            return
        seen.add(id(obj))
        parent = obj.parent or obj
        if obj.is_class:
            obj.bases = _public_bases(obj)
        if obj.is_function:
            if obj.name == "__init__" and obj.docstring is not None:
                if obj.docstring.value.strip() == _BOILERPLATE:
                    obj.docstring = None
            obj.returns = _expression(obj.returns, parent)
            for parameter in obj.parameters:
                parameter.annotation = _expression(parameter.annotation, parent)
                parameter.default = _expression(parameter.default, parent)
        if obj.is_attribute:
            obj.annotation = _expression(obj.annotation, parent)
            obj.value = _expression(obj.value, parent)
        for member in list(obj.members.values()):
            self._visit(member, seen)
