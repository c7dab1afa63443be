"""The layers a worker holds: planner layers with one AdamW each, kept from epoch to epoch.

A worker builds the layers of its stage from the seed (`model.build_layer`, bit-identical
wherever they are built) or keeps the ones it held in the previous epoch; the executor runs
them and steps their optimizers, and their state (`model.LayerState`) is what snapshots and
layer transfers copy. Not here: running a schedule (`planaria.agent.execution.executor`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from planaria.agent.training import model, semantics


class HeldLayers:
    """The planner layers a worker holds, each with its own AdamW (`model.make_optimizer`).

    They outlive executors: a worker that keeps its layers from one epoch to the next keeps
    this object and hands it to the next epoch's executor.
    """

    def __init__(
        self,
        modules: Mapping[int, nn.Module],
        optimizers: Mapping[int, torch.optim.Optimizer],
        device: torch.device,
    ) -> None:
        self.modules = dict(modules)
        self.optimizers = dict(optimizers)
        self.device = device

    @classmethod
    def build(
        cls, config: semantics.TrainingConfig, indices: Iterable[int], device: str = "cpu"
    ) -> HeldLayers:
        """Layers `indices` freshly initialised from the configuration's seed."""
        shape, target = config.shape, torch.device(device)
        modules = {i: model.build_layer(shape, config.seed, i, target) for i in indices}
        optimizers = {i: model.make_optimizer(m, config.optimizer) for i, m in modules.items()}
        return cls(modules, optimizers, target)

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(sorted(self.modules))

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point dtype of the layers (of the hidden states between them)."""
        first = self.modules[self.indices[0]]
        return next(first.parameters()).dtype

    def run(self, start: int, stop: int, x: torch.Tensor) -> torch.Tensor:
        return model.run_layers([self.modules[i] for i in range(start, stop)], x)

    def parameters(self, layers: Iterable[int]) -> list[nn.Parameter]:
        return [p for i in layers for p in self.modules[i].parameters()]

    def step(self, layers: Iterable[int]) -> None:
        """One AdamW step of each layer; a parameter nobody computed a gradient for steps with
        a zero gradient (as in the reference, where every layer gets one every step)."""
        for i in layers:
            for p in self.modules[i].parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self.optimizers[i].step()
            self.optimizers[i].zero_grad(set_to_none=True)

    def clear_grads(self) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    def states(self) -> dict[int, model.LayerState]:
        """A copy of every held layer's parameters and AdamW state."""
        return {
            i: model.extract_layer_state(i, self.modules[i], self.optimizers[i])
            for i in self.indices
        }
