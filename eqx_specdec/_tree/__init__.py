"""Tree verification: its verifiers, node rules and their step."""

from . import step as step  # registers the tree verifiers' step with `verify`
