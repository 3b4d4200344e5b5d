"""The hub: :func:`from_pretrained` loads a trained insertion model as an
:class:`~fairseq_insertion.hub_interface.InsertionHubInterface` (fairseq's
``GeneratorHubInterface`` plus hard constraints and templates given as text).
"""

from .hub_interface import InsertionHubInterface
from .model import InsertionTransformerModel

__all__ = ["InsertionHubInterface", "from_pretrained"]

from_pretrained = InsertionTransformerModel.from_pretrained  # an InsertionHubInterface: translate with constraints=
