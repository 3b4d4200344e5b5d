"""A minimal fairseq ``--user-dir`` for loading plain fairseq checkpoints on torch >= 2.6.

torch >= 2.6 loads checkpoints with ``weights_only=True``, which refuses the
``argparse.Namespace`` that fairseq stores in every checkpoint. ``--user-dir
fairseq_insertion`` registers it too, but also replaces fairseq's own NAT
``insertion_transformer``; this directory only registers the class, so fairseq's
own models (``transformer``, the built-in NAT ``insertion_transformer``) load with
the safe loader kept on::

    fairseq-generate DATA --path transformer.pt --user-dir examples/multi30k/fairseq_safe_load
"""

import argparse

import torch

torch.serialization.add_safe_globals([argparse.Namespace])
