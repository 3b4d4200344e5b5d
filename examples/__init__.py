"""Recipes around the plugin; a package so that ``examples.multi30k`` imports from the repository root."""
