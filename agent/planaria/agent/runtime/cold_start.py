"""A fresh agent process's one-time costs, paid first thing rather than inside an epoch.

torch imports much of itself on first use: the first `torch.optim.AdamW` built in a process
imports torch._dynamo and sympy (about 800 modules; 1 s on an idle core of the 2-core dev
machine, several seconds under load). An agent builds its first optimizer while setting up its
first epoch, where its peers wait with the epoch's timeout: a restarted worker joining by a
scale-up made its senders' layer copies time out, or reached the rendezvous after the others
gave up (chaos pipeline seeds 29, 30 and 48, docs/chaos.md). The runtime's training thread calls
`warm_up` first, before it takes a command, while the agent already serves: a Configure that
comes meanwhile (a scale-up's, planned a switch lead ahead) is set up once it is done, so the
cost overlaps the lead instead of the peers' wait. Paying it before serving would delay every
agent's start and a returning worker's join by as much. Not here: the model's own
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
