"""``insertion_translation``: fairseq's translation task plus insertion decoding
options; builds the :class:`InsertionGenerator` and never drops a sentence."""


import io
import logging
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from fairseq.data import FairseqDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from torch import Tensor

from .checkpoints import dictionary_files, warm_start
from .constraints import ConstraintEncoder, ConstraintsFile, TextEncoders
from .decoding import CONSTRAINT_ORDERS, DECODINGS, DecodingConfig
from .generator import InsertionGenerator
from .model import InsertionTransformerModel
from .precision import PRECISIONS, for_decoding
from .rerank import AutoregressiveScorer

logger = logging.getLogger(__name__)

DEFAULTS = DecodingConfig()  # every decoding default lives there


@dataclass
class InsertionTranslationConfig(TranslationConfig):
    decoding: ChoiceEnum(list(DECODINGS)) = field(  # type: ignore[valid-type]
        default=DEFAULTS.decoding,
        metadata={"help": "parallel: insert into every slot whose argmax is not end-of-slot; greedy: one "
                  "insertion per step (paper: Inference)"},
    )
    eos_penalty: float = field(
        default=DEFAULTS.eos_penalty,
        metadata={"help": "beta, subtracted from the end-of-slot/sequence log-probability when decoding (choose "
                  "it on valid: the best beta depends on the model)"},
    )
    max_iterations: int = field(
        default=DEFAULTS.max_iterations,
        metadata={"help": "stop a sentence after this many insertion iterations (0: its length limit, "
                  "min(max_len_a * src_len + max_len_b, max target positions - 2); fairseq's defaults 0 and 200 "
                  "become %g x src_len + %d)" % (DEFAULTS.max_len_a, DEFAULTS.max_len_b)},
    )
    eos_penalties: Optional[str] = field(
        default=None,
        metadata={"help": "comma-separated betas, e.g. 0,1,2,3,4: decode every sentence under each in one batch "
                  "and output its candidates best first (--nbest k prints k), by the model's "
                  "length-normalised score or --rerank-with's; replaces --eos-penalty"},
    )
    rerank_with: Optional[str] = field(
        default=None,
        metadata={"help": "a fairseq transformer checkpoint trained on the same dictionaries (e.g. the "
                  "distillation teacher): choose among the --eos-penalties candidates by its length-normalised "
                  "log p(y | x), one teacher-forced batch per batch of sentences"},
    )
    rerank_weight: float = field(
        default=DEFAULTS.rerank_weight,
        metadata={"help": "lambda: with --rerank-with, a candidate's score is the reranker's length-normalised "
                  "log-probability + lambda x the insertion model's own score (choose it on valid)"},
    )
    block_neighbour_copies: bool = field(
        default=DEFAULTS.block_neighbour_copies,
        metadata={"help": "a slot never inserts a copy of either neighbour token (parallel decoding of an "
                  "undertrained model otherwise grows runs like 'vor vor vor ...'); fairseq's --no-repeat-ngram-size "
                  "N adds an n-gram rule. Both off by default: some outputs legitimately repeat a token"},
    )
    close_ended_slots: bool = field(
        default=DEFAULTS.close_ended_slots,
        metadata={"help": "a slot whose best token is end-of-slot stays closed for the rest of the decode, so "
                  "later passes score only the open slots (models trained with slot finalization; can change "
                  "the output)"},
    )
    decode_precision: ChoiceEnum(list(PRECISIONS)) = field(  # type: ignore[valid-type]
        default=DEFAULTS.precision,
        metadata={"help": "convert the models for decoding: bf16 (bfloat16 weights and activations; CPUs with "
                  "AVX512-BF16/AMX, GPUs with bf16), int8 (CPU: dynamic quantization of the linear layers); the "
                  "same conversion applies to --rerank-with's model and to an autoregressive transformer decoded "
                  "through this task (fairseq's beam search), so speeds compare like with like"},
    )
    constraints_file: Optional[str] = field(
        default=None,
        metadata={"help": "fairseq-generate: hard constraints for the test set, one line per sentence id, "
                  "constraints separated by tabs (___ marks a template gap); they go through --tokenizer/--bpe "
                  "when given, else must already be tokenised and BPE'd like the target. Order: --constraints"},
    )


@register_task("insertion_translation", dataclass=InsertionTranslationConfig)
class InsertionTranslationTask(TranslationTask):
    """Translation with an Insertion Transformer."""

    cfg: InsertionTranslationConfig

    def __init__(self, cfg: InsertionTranslationConfig, src_dict, tgt_dict):
        super().__init__(cfg, src_dict, tgt_dict)
        DecodingConfig.from_options(cfg)  # a decoding option that means nothing is refused before any work
        # --constraints-file, read here; build_generator checks it against the test set
        self.constraints_file = ConstraintsFile(cfg.constraints_file) if cfg.constraints_file else None
        self.text_encoders = TextEncoders()  # filled by build_tokenizer/build_bpe
        # datasets loaded for training: fairseq's size rule (see filter_indices_by_size)
        self._training_datasets: "weakref.WeakSet[FairseqDataset]" = weakref.WeakSet()

    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs: Any) -> None:
        """fairseq-generate (and -validate) pass the checkpoint's saved task config as ``task_cfg``;
        fairseq-train does not: its splits are the training datasets."""
        super().load_dataset(split, epoch, combine, **kwargs)
        if kwargs.get("task_cfg") is None:
            self._training_datasets.add(self.datasets[split])

    def build_model(self, cfg, from_checkpoint: bool = False):
        model = super().build_model(cfg, from_checkpoint)
        if not from_checkpoint:  # a trained checkpoint never needs --init-from-transformer's file again
            warm_start(model, cfg, dictionary_files(self.cfg))
        return model

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        """For a dataset loaded for training (:meth:`load_dataset` without a
        saved task config: fairseq-train's train and valid splits), fairseq's
        rule (raise, or skip with --skip-invalid-size-inputs-valid-test). For
        any other (fairseq-generate's test set, fairseq-interactive's and the
        hub's lines), a line too long for the model is skipped with an error
        naming it, and every other line is translated."""
        if dataset in self._training_datasets:
            return super().filter_indices_by_size(indices, dataset, max_positions, ignore_invalid_inputs)
        indices, ignored = dataset.filter_indices_by_size(indices, max_positions)
        for i in ignored:
            start = self.source_dictionary.string(dataset.src[i][:6])
            logger.error("sentence %d (%r ...): %d source tokens exceed the model's limit (max positions %s); "
                         "skipped, not translated", i, start, dataset.src_sizes[i], max_positions)
        if len(ignored):
            logger.error("skipped %d over-long sentence(s): ids %s", len(ignored), list(map(int, ignored)))
        return indices

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        """The insertion generator for ``args`` (fairseq's generation options, or the hub's keywords) and
        this task's options, through one :class:`DecodingConfig`; an autoregressive transformer gets
        fairseq's own generator at the same ``--decode-precision``."""
        _tolerate_invalid_utf8_stdin()
        constraint_order = getattr(args, "constraints", None)
        if constraint_order is not None and str(constraint_order) not in CONSTRAINT_ORDERS:
            # e.g. a plain GeneratorHubInterface.translate(..., constraints=["word"])
            raise ValueError("--constraints is ordered or unordered; constraints as text need the insertion hub "
                             "interface, fairseq_insertion.hub."
                             "from_pretrained(...) or InsertionHubInterface.from_hub(hub); "
                             f"got constraints={constraint_order!r}")
        config = DecodingConfig.from_options(self.cfg, args)
        for model in models:  # (fairseq's make_generation_fast_ makes model.eval() return None: no chaining)
            model.eval()
            for_decoding(model, config.precision)
        if not all(isinstance(m, InsertionTransformerModel) for m in models):
            if any(isinstance(m, InsertionTransformerModel) for m in models):
                raise ValueError("an ensemble of insertion and autoregressive models cannot be decoded together")
            # an autoregressive transformer (e.g. the teacher, timed beside the insertion model at the same
            # --decode-precision): fairseq's own generator
            return super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs,
                                           prefix_allowed_tokens_fn)
        if self.constraints_file is not None:
            self.constraints_file.check_sentences({split: len(ds) for split, ds in self.datasets.items()})
        rerank = None
        if config.rerank_with:
            device = next(models[0].parameters()).device if models else "cpu"
            rerank = AutoregressiveScorer.load(config.rerank_with, self.source_dictionary, self.target_dictionary,
                                               device, lenpen=config.lenpen, dictionaries=dictionary_files(self.cfg))
            for_decoding(rerank.model, config.precision)
        return InsertionGenerator(self.target_dictionary, config, src_dict=self.source_dictionary, rerank=rerank)

    # --- constraints: fairseq-interactive's tab-separated ones, --constraints-file, the hub (hub.py)
    def build_tokenizer(self, args) -> ConstraintEncoder:
        """The tokenizer as fairseq-interactive's encoder of ``--constraints`` (decode: the tokenizer's); the
        raw one goes to :attr:`text_encoders`."""
        self.text_encoders.tokenizer = super().build_tokenizer(args)
        return ConstraintEncoder(self.text_encoders.tokenizer, self.target_dictionary, last=False)

    def build_bpe(self, args) -> ConstraintEncoder:
        """The BPE as fairseq-interactive's encoder of ``--constraints``; the raw one goes to
        :attr:`text_encoders`."""
        self.text_encoders.bpe = super().build_bpe(args)
        return ConstraintEncoder(self.text_encoders.bpe, self.target_dictionary, last=True)

    def get_interactive_tokens_and_lengths(self, lines, encode_fn):
        """fairseq-interactive's source lines. ``encode_fn`` is built from the constraint encoders
        :meth:`build_tokenizer`/:meth:`build_bpe` return, so sources go through the raw ones instead."""
        return super().get_interactive_tokens_and_lengths(lines, self.text_encoders.encode)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None,
                       constraints_by_id: Optional[Tensor] = None):
        """``constraints``: packed (B, C), fairseq-interactive's. Else ``constraints_by_id``: packed (N, C)
        for every sentence id (the hub's, through ``inference_step_args``), rows taken for the batch's ids;
        else those of ``--constraints-file``."""
        if constraints is None and constraints_by_id is not None:
            constraints = constraints_by_id[sample["id"].cpu()]  # (B, C)
        elif constraints is None and self.constraints_file is not None:
            constraints = self.constraints_file.packed(sample["id"].tolist(), self.text_encoders.encode,
                                                       self.target_dictionary)  # (B, C)
        if constraints is not None:
            constraints = constraints.to(sample["net_input"]["src_tokens"].device)
        return super().inference_step(generator, models, sample, prefix_tokens, constraints)

    def get_batch_iterator(self, dataset, *args: Any, **kwargs: Any):
        keep_remainder_batch(dataset)
        return super().get_batch_iterator(dataset, *args, **kwargs)


def keep_remainder_batch(dataset: FairseqDataset) -> None:
    """Make ``dataset.batch_by_size`` keep every sentence.

    fairseq drops the final batch when its size is not a multiple of
    ``--required-batch-size-multiple``; in training, validation and
    inference that silently loses sentences. Batches are consecutive runs
    of ``indices``, so whatever is missing is the tail: batch it on its own.
    """
    batch_by_size = dataset.batch_by_size
    if getattr(batch_by_size, "keeps_remainder", False):
        return

    def batch_all(indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        batches = batch_by_size(indices, max_tokens=max_tokens, max_sentences=max_sentences,
                                required_batch_size_multiple=required_batch_size_multiple)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            tail = np.asarray(indices[covered:], dtype=np.int64)
            logger.info("kept a final batch of %d sentences that fairseq would drop", len(tail))
            batches = list(batches) + [tail]
        return batches

    batch_all.keeps_remainder = True  # type: ignore[attr-defined]
    dataset.batch_by_size = batch_all


def _tolerate_invalid_utf8_stdin() -> None:
    """fairseq-interactive decodes standard input strictly: one invalid UTF-8
    byte would end the run. Replace such bytes with U+FFFD instead; the word
    holding it is then unknown, and the generator names its line."""
    stdin = sys.stdin
    if isinstance(stdin, io.TextIOWrapper) and stdin.errors == "strict":
        stdin.reconfigure(errors="replace")
        logger.info("invalid UTF-8 bytes in standard input are read as U+FFFD (reported as unknown words)")
