"""The one base class of the plugin's refusals (:class:`InsertionError`); each part's own error subclasses it."""


class InsertionError(ValueError):
    """An input, a file or an option the plugin cannot take; the message names it, in one line. The plugin's
    commands print it and exit with an error; a ``ValueError``, so callers that catch those catch it too."""
