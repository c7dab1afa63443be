"""The reference trainer: the whole model in one process, the oracle distributed runs must match.

One training step, exactly as the pipeline executor must reproduce it (up to the order in which
floating-point sums are taken):

1. the step's global batch of B samples comes from `data.Sampler(num_samples, B, seed)`;
2. it is cut into B / b micro-batches of b consecutive samples (`Sampler.split` with one
   pipeline);
3. for each micro-batch, in order: forward through all planner layers, `model.micro_batch_loss`
   (token cross-entropy summed, divided by B * seq_len), both under bfloat16 autocast in bf16
   (`precision.forward`, as the executor), backward; gradients accumulate, so each
   parameter's gradient is the sum over micro-batches (in float32, or in exact mode in float64,
   rounded once: `reduction.GradientSums`, the executor's very object); a tied embedding
   matrix's two copies then both take the sum of the two uses' totals, embedding use first
   (`tying.tie_gradients`, the order the executor's exchange keeps);
4. every layer's own AdamW (`model.make_optimizer`) steps once, and gradients are cleared.

The step's loss is the sum of the micro-batch losses: the mean token loss of the global batch.
Nothing here is clever on purpose; it is kept obviously right.

Errors: data and model errors (`data.DataError`, `model.ModelError`) pass through.
"""

from __future__ import annotations

import torch

from planaria.agent.training import data, model, precision, reduction, semantics, tying

CPU = torch.device("cpu")  # the reference trains on the CPU (TF32 is FP32 there)


class ReferenceTrainer:
    """Single-process training of all planner layers with gradient accumulation.

    Call `step(0)`, `step(1)`, ... in order; each returns that step's loss. Layer `i`'s module,
    optimizer and state are `layers[i]`, `optimizers[i]`, `layer_state(i)`.
    `reverse_micro_batches` runs each step's micro-batches last to first: the same training
    with the gradients summed in another order, which measures how much summation order alone
    moves the result (`comparison.SensitivityBounds`); in exact mode it changes nothing.
    """

    def __init__(
        self,
        config: semantics.TrainingConfig,
        tokens: data.Tokens,
        *,
        reverse_micro_batches: bool = False,
    ) -> None:
        self.config = config
        self.reverse_micro_batches = reverse_micro_batches
        job = semantics.Job.from_tokens(config, tokens)  # as every worker builds it
        self.dataset, self.sampler = job.dataset, job.sampler
        self.layers = model.build_layers(config.shape, config.seed)
        self.optimizers = [model.make_optimizer(layer, config.optimizer) for layer in self.layers]

    def step(self, step_index: int) -> float:
        """Train on step `step_index`'s global batch; returns its mean token loss."""
        with reduction.compute_threads(self.config.reduction):
            return self._step(step_index)

    def _step(self, step_index: int) -> float:
        config = self.config
        (micro_batches,) = self.sampler.split(
            step_index, config.micro_batch_size, [config.num_micro_batches]
        )
        if self.reverse_micro_batches:
            micro_batches = micro_batches[::-1]
        sums = reduction.GradientSums(config.reduction)
        params = [p for layer in self.layers for p in layer.parameters()]
        loss = 0.0
        for samples in micro_batches:
            inputs, targets = self.dataset.batch(samples)
            with precision.forward(config.precision, CPU):
                logits = model.run_layers(self.layers, inputs)
                micro_loss = model.micro_batch_loss(logits, targets, config.global_batch_size)
            torch.autograd.backward(micro_loss)
            sums.absorb(params)
            loss += micro_loss.item()
        tying.tie_gradients(config.shape, self.layers, sums)
        sums.settle(params)
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    def layer_state(self, index: int) -> model.LayerState:
        """A copy of layer `index`'s parameters and AdamW state."""
        return model.extract_layer_state(index, self.layers[index], self.optimizers[index])

    def load_layer_state(self, state: model.LayerState) -> None:
        """Overwrite layer `state.index` with `state` (bit-exact)."""
        index = state.index
        model.load_layer_state(index, self.layers[index], self.optimizers[index], state)

    @torch.no_grad()
    def evaluate(self, samples: tuple[int, ...]) -> float:
        """Mean token loss of `samples` without training (no gradients, no optimizer step)."""
        inputs, targets = self.dataset.batch(samples)
        with precision.forward(self.config.precision, CPU):
            logits = model.run_layers(self.layers, inputs)
            return model.micro_batch_loss(logits, targets, len(samples)).item()
