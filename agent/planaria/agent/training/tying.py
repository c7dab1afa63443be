"""Tied input/output embeddings: one matrix used twice, trained as one parameter.

A Hugging Face config with `tie_word_embeddings` (GPT-2's default, `hf_models.ties_embeddings`)
uses the token-embedding matrix W twice: to look tokens up (planner layer 0, the first stage)
and to project the final hidden states onto the vocabulary (the head, the last planner layer,
the last stage). As in Megatron, each of the two layers holds a copy of W (`hf_models.
tied_matrix`), so no stage reads another's parameters during a step; the tie is kept by
training the two copies as one parameter:

- the copies start equal (the head's is drawn from the embedding layer's generator, or read
  from the checkpoint's one embedding tensor: `hf_models`);
- each step, once every use is summed (over micro-batches and over the holders of each layer,
  i.e. after the per-layer all-reduces), W's gradient is

      G = E + H      E: the embedding use's total (layer 0's gradient of W)
                     H: the head use's total (the head's gradient of W)

  in this one order (`combine`), in the reduction's dtype: float64 in exact mode, rounded once
  to float32 afterwards (`reduction.GradientSums.settle`), float32 in fast mode. Both copies
  take the same G;
- each copy's own AdamW (in its layer's optimizer, same hyper-parameters, state starting at
  zero together) then applies the same update from the same state, so the copies stay
  bit-identical: AdamW's state of W is kept once per holder, identically. Snapshots,
  checkpoints and layer transfers carry each layer with its copy and state as before.

The reference trainer, holding both layers, calls `tie_gradients`; the executor exchanges E and
H between the stages holding them (`planaria.agent.execution.tied_embeddings`) and calls
`combine` with the same order on every holder.

Not here: which worker sends which use to whom (the executor's side), the checkpoint export
(`hf_export` writes the one tensor when the copies are equal).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from planaria.agent.training import hf_models, reduction
from planaria.contract import shapes


def ties(shape: shapes.ModelShape) -> bool:
    """Whether `shape`'s embedding layer and head hold copies of one tied matrix."""
    return hf_models.ties_embeddings(shape)


def head_index(shape: shapes.ModelShape) -> int:
    """The planner layer of the head (the embedding layer is layer 0)."""
    return shape.num_planner_layers - 1


def combine(embedding_use: torch.Tensor, head_use: torch.Tensor) -> torch.Tensor:
    """The tied gradient from its two uses' totals, always in this order (module docstring)."""
    return embedding_use + head_use


def tie_gradients(
    shape: shapes.ModelShape, layers: Sequence[nn.Module], sums: reduction.GradientSums
) -> None:
    """In one process holding every layer of `shape` (before `sums.settle`): give both copies
    of a tied matrix the combined gradient of their two uses; nothing for an untied model."""
    if not ties(shape):
        return
    embedding = hf_models.tied_matrix(layers[0])
    head = hf_models.tied_matrix(layers[head_index(shape)])
    tied = combine(sums.total(embedding), sums.total(head))
    sums.replace(embedding, tied)
    sums.replace(head, tied.clone())  # each copy owns its gradient tensor
