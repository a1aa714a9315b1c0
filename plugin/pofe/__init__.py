"""POFE: RRHF and SPPO preference optimisation for Axolotl.

Recipes list `plugins: [pofe.PofePlugin]` and set `rl: rrhf` or `rl: sppo`.
"""

__version__ = "0.1.0"
__all__ = ["PofePlugin", "__version__"]


def __getattr__(name: str):
    # Lazy, so `pofe.losses` and `pofe_candidates` import without axolotl.
    if name == "PofePlugin":
        from pofe.plugin import PofePlugin

        return PofePlugin
    raise AttributeError(f"module 'pofe' has no attribute {name!r}")
