"""The insertion hub interface (``from_pretrained`` returns one): fairseq's plus constraints and templates as text."""

import logging
from typing import Dict, List, Optional, Union

import torch
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.token_generation_constraints import pack_constraints

from .constraints import encode_constraints
from .fairseq_fixes import realign, skipped_inputs

logger = logging.getLogger(__name__)


class InsertionHubInterface(GeneratorHubInterface):
    """fairseq's hub interface, plus ``translate(sentence, constraints=["word a", "b"])`` (a list of sentences: one
    list each; ``___`` marks a template gap). One result per input, in order: a sentence too long for the model gets
    an empty result and a warning naming its index."""

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
            return self._decode_all(sentences, beam, verbose, **kwargs)
        if len(constraints) != len(sentences) or any(isinstance(c, str) for c in constraints):
            raise ValueError(f"constraints: give one list of strings per sentence ({len(sentences)} sentences); "
                             f"got {constraints!r}")
        # packed (N, C), row i for sentence id i; the task's inference_step takes each batch's rows. A sentence
        # the task will not translate (over-long) keeps none: its result is empty
        over = set(self.task.over_long([self.encode(s) for s in sentences]))
        constraints_by_id = pack_constraints([
            encode_constraints([] if i in over else cs, lambda x: self.apply_bpe(self.tokenize(x)), self.tgt_dict,
                               f"sentence {i} ({s!r})")
            for i, (s, cs) in enumerate(zip(sentences, constraints))])
        step_args = {**(kwargs.pop("inference_step_args", None) or {}), "constraints_by_id": constraints_by_id}
        return self._decode_all(sentences, beam, verbose, constraints=constraint_order,
                                inference_step_args=step_args, **kwargs)

    def _decode_all(self, sentences: List[str], beam: int, verbose: bool, **kwargs) -> List[str]:
        """fairseq's ``sample``, with ``""`` for a sentence that has no hypothesis."""
        batched = self.generate([self.encode(s) for s in sentences], beam, verbose, **kwargs)
        return [self.decode(hypos[0]["tokens"]) if hypos else "" for hypos in batched]

    def generate(self, tokenized_sentences, beam: int = 5, verbose: bool = False, *args,
                 **kwargs) -> List[List[Dict[str, torch.Tensor]]]:
        """fairseq's ``generate``, one result per input in input order: the inputs too long for the
        model (which fairseq's batching skips) get ``[]`` and a warning naming their index."""
        if torch.is_tensor(tokenized_sentences) and tokenized_sentences.dim() == 1:
            return self.generate(tokenized_sentences.unsqueeze(0), beam, verbose, *args, **kwargs)[0]
        tokens = list(tokenized_sentences)
        if not tokens:
            return []
        over = set(self.task.over_long(tokens))  # the task gives these an empty source
        skipped = skipped_inputs([1 if i in over else t.numel() for i, t in enumerate(tokens)], self.max_positions)
        for i in skipped:
            logger.warning("input %d: %d tokens, too long for the model (max positions %s); not translated, "
                           "its result is empty", i, tokens[i].numel(), self.max_positions)
        results = super().generate(tokens, beam, verbose, *args, **kwargs) if len(skipped) < len(tokens) else []
        return realign(results, skipped, len(tokens), [])
