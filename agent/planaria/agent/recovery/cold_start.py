"""A fresh agent process's one-time costs, paid before an epoch's rendezvous.

torch imports much of itself on first use: the first `torch.optim.AdamW` built in a process
imports torch._dynamo and sympy (about 800 modules; 1 s on an idle core of the 2-core dev
machine, several seconds under load). An agent builds its first optimizer while setting up its
first epoch, where its peers wait with the epoch's timeout: a restarted worker joining by a
scale-up made its senders' layer copies time out, or reached the rendezvous after the others
gave up (chaos pipeline seeds 29, 30 and 48, docs/chaos.md). `epoch_setup.set_up` calls
`warm_up` first, before the rendezvous: a scale-up's newcomer pays it while the running workers
still train towards the switch step (and shows CONFIGURING meanwhile, as the controller's
settle bound expects of a set-up), not while they wait to send it layers. After the first
call it costs microseconds. Warming up at process start instead delayed the first Configure's
set-up behind an IDLE heartbeat, which the settle bound does not wait for (a `returns` trial
Suspended); before serving, it delayed every start and join by as much. Not here: the model's own
layers (built per epoch, `planaria.agent.training.model`).
"""

from __future__ import annotations

import torch


def warm_up() -> None:
    """Build and step one throwaway AdamW over one parameter: what a set-up and a step use
    first is then imported and initialised."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter])
    parameter.grad = torch.zeros(1)
    optimizer.step()
