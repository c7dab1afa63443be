"""What fixes a training run's semantics, identical on every worker: configuration and data.

`TrainingConfig` names the model shape, seed, batch sizes, optimizer and how gradients are
summed. `Job` adds the token dataset and the global-batch sampler built from them; every worker
and the reference trainer build both with `Job.from_tokens`, so a step trains on the same
samples wherever and however it runs.

Not here: the model (`model`), corpus, dataset and sampler themselves (`data`).

Errors: TrainingConfigError (ValueError) for a configuration out of range; data errors
(`data.DataError`) pass through `Job.from_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planaria.agent.training import data, hf_models, model
from planaria.contract import shapes
from planaria.wire import messages


class TrainingConfigError(ValueError):
    """A training configuration out of range; the message names the field and the fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """What fixes a training run's semantics: model, seed, batch sizes, optimizer.

    `seed` seeds both the layers' initial parameters and the sampler; `reduction` says how
    gradients are summed (`planaria.agent.training.reduction`), `precision` the arithmetic of
    forward and backward (`planaria.agent.training.precision`). Raises TrainingConfigError when a
    size is < 1, the global batch is not a multiple of the micro-batch, or transformers refuses
    a Hugging Face shape's config. That check also imports transformers here, when a worker
    learns its job and before it joins an epoch's group, not between two collectives (a
    first import takes seconds, and a peer waiting in a collective has a step timeout).
    """

    shape: shapes.ModelShape
    seed: int
    global_batch_size: int
    micro_batch_size: int
    optimizer: model.OptimizerConfig = field(default_factory=model.OptimizerConfig)
    reduction: messages.Reduction = messages.Reduction.FAST
    precision: messages.Precision = messages.Precision.FP32

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise TrainingConfigError(f"seed must be >= 0 (got {self.seed})")
        for name in ("global_batch_size", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise TrainingConfigError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.global_batch_size % self.micro_batch_size:
            raise TrainingConfigError(
                f"global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"micro_batch_size ({self.micro_batch_size}); change one of them"
            )
        if self.shape.family in shapes.HF_FAMILIES:
            try:
                hf_models.hf_config(self.shape)
            except hf_models.HfModelError as exc:
                raise TrainingConfigError(str(exc)) from exc

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch_size // self.micro_batch_size


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Job:
    """What fixes training semantics, identical on every worker: configuration and data."""

    config: TrainingConfig
    dataset: data.TokenDataset
    sampler: data.Sampler

    @classmethod
    def from_tokens(cls, config: TrainingConfig, tokens: data.Tokens) -> Job:
        """The dataset of `tokens` in windows of the model's sequence length, and the sampler
        of its samples seeded with the configuration's seed."""
        dataset = data.TokenDataset(tokens=tokens, seq_len=config.shape.seq_len)
        sampler = data.Sampler(
            num_samples=dataset.num_samples,
            global_batch_size=config.global_batch_size,
            seed=config.seed,
        )
        return cls(config=config, dataset=dataset, sampler=sampler)
