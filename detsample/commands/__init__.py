"""Sub-commands of the ``detsample`` CLI: one module each, exposing ``register(subparsers)``."""
