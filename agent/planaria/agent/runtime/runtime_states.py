"""Reading a run's final layer states, and the reference's, for tests and benchmarks.

When a runtime reaches its stop_step it makes the snapshot of that step complete before it
reports FINISHED (when snapshots are on and the step is due, as it always is with interval 1).
`read_final_states` then rebuilds every layer of the plan at that step from the workers' stores
under the snapshot base (`snapshots.load_layer` over each layer's sharding group), with no
process of the run alive. `reference_states` trains the fault-free reference trainer to the
same committed step: committed step t is the reference's `step(t - 1)`.

Errors: `snapshot_store`'s (SnapshotMissing, SnapshotCorrupt) when a layer cannot be rebuilt.
"""

from __future__ import annotations

from pathlib import Path

from planaria.agent.runtime import training_thread
from planaria.agent.state import snapshot_store, snapshots
from planaria.agent.training import corpora, model, reference
from planaria.contract import plan
from planaria.wire import messages


def read_final_states(
    job: str, snapshot_base: Path, plan_: plan.Plan, step: int
) -> dict[int, model.LayerState]:
    """Every layer of `plan_` at committed `step`, rebuilt from the workers' snapshot stores."""
    members = snapshots.sharding_groups(plan_)
    stores = {
        w: snapshot_store.SnapshotStore(snapshot_store.store_root(job, w, snapshot_base))
        for w in plan_.workers
    }
    return {
        layer: snapshots.load_layer([stores[w] for w in group], step, layer)
        for layer, group in members.items()
    }


def reference_states(
    settings: messages.TrainingSettings, micro_batch_size: int, step: int
) -> tuple[dict[int, model.LayerState], list[float]]:
    """The reference trainer's layer states after committed `step`, and each step's loss."""
    corpus = corpora.load(settings.data)
    config = training_thread.training_config(settings, micro_batch_size, corpus.vocab_size)
    trainer = reference.ReferenceTrainer(config, corpus.tokens)
    losses = [trainer.step(i) for i in range(step)]
    layers = range(config.shape.num_planner_layers)
    return {i: trainer.layer_state(i) for i in layers}, losses
