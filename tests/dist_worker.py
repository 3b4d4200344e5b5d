"""Runs fairseq-train in this process and, whenever fairseq saves a checkpoint,
also writes this rank's parameters to DUMP_DIR/rank<R>.pt, so a test can compare
the ranks of a distributed run (fairseq itself saves on rank 0 only)."""

import os

import torch
from fairseq_cli import train

_save = train.checkpoint_utils.save_checkpoint


def save_and_dump(cfg, trainer, epoch_itr, val_loss):
    params = {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}
    torch.save(params, os.path.join(os.environ["DUMP_DIR"], f"rank{trainer.data_parallel_rank}.pt"))
    return _save(cfg, trainer, epoch_itr, val_loss)


if __name__ == "__main__":
    train.checkpoint_utils.save_checkpoint = save_and_dump
    train.cli_main()
