"""gac — GPU-Aligned Compression.

Packages, from the pure core up: ``align`` (targets, candidate sets, the exact solver, strategies); ``fixtures``
(the named models gac runs offline) -> ``text`` (text sources) -> ``compression`` (discovery, importance,
allocation, compressors, the layer swap, checkpoints, prepared state) -> ``models`` / ``evaluation`` /
``profiling``; ``training`` (tiny from its recipe) above ``evaluation``; ``results`` (the store; depends on nothing
above ``io``) -> ``analysis`` (reads the store) -> ``jobs`` (the one job, its Hydra bridge, run loggers) ->
``launch`` -> ``commands`` / ``cli``. A package never imports one above it, and no two modules import each other;
``tests/test_layering.py`` checks every import.
"""

__version__ = "0.2.0"
