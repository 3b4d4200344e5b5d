"""The hub: :func:`from_pretrained` loads a trained insertion model as an
:class:`~fairseq_insertion.hub_interface.InsertionHubInterface` (fairseq's
``GeneratorHubInterface`` plus hard constraints and templates given as text).
"""

from .hub_interface import InsertionHubInterface
from .model import InsertionTransformerModel

__all__ = ["InsertionHubInterface", "from_pretrained"]


def from_pretrained(model_name_or_path: str, checkpoint_file: str = "model.pt", data_name_or_path: str = ".",
                    **kwargs) -> InsertionHubInterface:
    """``InsertionTransformerModel.from_pretrained``: an :class:`InsertionHubInterface`
    (translate with ``constraints=``)."""
    return InsertionTransformerModel.from_pretrained(model_name_or_path, checkpoint_file=checkpoint_file,
                                                     data_name_or_path=data_name_or_path, **kwargs)
