"""The Multi30k recipe: ``prepare.py`` and ``score.py`` (standalone scripts), ``recipe.py``
(``python -m examples.multi30k.recipe`` from the repository root) and ``constraints.py``."""
