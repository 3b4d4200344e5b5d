"""The insertion hub interface: fairseq's ``GeneratorHubInterface`` plus hard
constraints and templates given as text.

:meth:`InsertionTransformerModel.from_pretrained
<fairseq_insertion.model.InsertionTransformerModel.from_pretrained>` and
:func:`fairseq_insertion.hub.from_pretrained` return one.
"""

from typing import List, Optional, Union

from fairseq.hub_utils import GeneratorHubInterface
from fairseq.token_generation_constraints import pack_constraints

from .constraints import encode_constraints


class InsertionHubInterface(GeneratorHubInterface):
    """fairseq's hub interface, plus hard constraints and templates.

    ``translate(sentence, constraints=["word a", "b"])``, or for a list of
    sentences one list of constraints each. Constraints are plain text,
    encoded with the hub's tokenizer and BPE like the target; ``___`` marks a
    template gap. ``constraint_order="unordered"`` lets the decoder choose
    the order (see :class:`fairseq_insertion.generator.InsertionGenerator`).
    """

    @classmethod
    def from_hub(cls, hub: GeneratorHubInterface) -> "InsertionHubInterface":
        """The same models, task and configuration, with constraint support."""
        return cls(hub.cfg, hub.task, list(hub.models))

    def sample(self, sentences: Union[str, List[str]], beam: int = 1, verbose: bool = False,
               constraints: Optional[Union[List[str], List[List[str]]]] = None,
               constraint_order: str = "ordered", **kwargs):
        if isinstance(sentences, str):
            batch = [constraints] if constraints is not None else None
            return self.sample([sentences], beam, verbose, constraints=batch, constraint_order=constraint_order,
                               **kwargs)[0]
        if constraints is None:
            return super().sample(sentences, beam, verbose, **kwargs)
        if len(constraints) != len(sentences) or any(isinstance(c, str) for c in constraints):
            raise ValueError(f"constraints: give one list of strings per sentence ({len(sentences)} sentences); "
                             f"got {constraints!r}")

        def encode_fn(x: str) -> str:
            return self.apply_bpe(self.tokenize(x))

        # packed (N, C), row i for sentence id i; the task's inference_step takes each batch's rows
        constraints_by_id = pack_constraints([
            encode_constraints(cs, encode_fn, self.tgt_dict, f"sentence {i} ({s!r})")
            for i, (s, cs) in enumerate(zip(sentences, constraints))])
        step_args = {**(kwargs.pop("inference_step_args", None) or {}), "constraints_by_id": constraints_by_id}
        return super().sample(sentences, beam, verbose, constraints=constraint_order,
                              inference_step_args=step_args, **kwargs)
