"""Tiny Hugging Face configs for the tests of `modelSource` (2 decoder blocks, byte vocabulary):
a Llama with grouped-query attention and a GPT-2, their shapes, and their layers after one
AdamW step (`trained`). Nothing is downloaded; transformers must be installed (planaria[hf])."""

from __future__ import annotations

import torch

from planaria.agent.training import model, reduction, tying
from planaria.contract import shapes
from planaria.wire import messages

SEED = 5
VOCAB = 256  # byte tokens
LLAMA = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 16,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
GPT2 = {
    "vocab_size": VOCAB,
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 16,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
FAMILIES = {"llama": LLAMA, "gpt2": GPT2}


def shape(family: str) -> shapes.ModelShape:
    """The shape of `family`'s tiny config (sequence length: its maximum, 16)."""
    return shapes.resolve(shapes.hf_reference(family, FAMILIES[family]))


def trained(
    of: shapes.ModelShape,
) -> tuple[list[torch.nn.Module], dict[int, model.LayerState]]:
    """The layers of `of` after one AdamW step on a random batch (a tied matrix's copies given
    the sum of both uses, `tying`), and their states."""
    layers = model.build_layers(of, SEED)
    optimizers = [model.make_optimizer(layer, model.OptimizerConfig(lr=1e-2)) for layer in layers]
    ids = torch.randint(0, of.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    logits = model.run_layers(layers, ids[:, :-1])
    torch.autograd.backward(model.micro_batch_loss(logits, ids[:, 1:], 2))
    tying.tie_gradients(of, layers, reduction.GradientSums(messages.Reduction.FAST))
    for optimizer in optimizers:
        optimizer.step()
    states = {
        i: model.extract_layer_state(i, layer, opt)
        for i, (layer, opt) in enumerate(zip(layers, optimizers, strict=True))
    }
    return layers, states


def parameter(layer: torch.nn.Module, name: str) -> torch.Tensor:
    """`layer`'s parameter `name` (e.g. wte.weight), typed."""
    return dict(layer.named_parameters())[name]
