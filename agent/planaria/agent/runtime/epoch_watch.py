"""The watcher: one thread per worker and epoch that releases the epoch's waits when the epoch
fails elsewhere.

It holds its own connection to the controller's rendezvous store and blocks on its rank's wake
key (`planaria.contract.rendezvous`): no polling, one pending store request per worker. When it
wakes and FAILED_KEY is set (another worker's step failed, or the controller declared a worker
lost or hung) it sets `failed`, which the executor's polled collectives read, and releases the
epoch's transport (`groups.Epoch.release`): every wait of this worker on the epoch, point to
point ones included, fails at once, whatever the peer it waits for is doing. `stop` (the worker
leaves the epoch) wakes it through the same key; after `stop` returns it never releases.
A store that goes away (its controller died) ends the watcher without releasing.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Callable

import torch.distributed as dist
from torch._C import _distributed_c10d as c10d  # the store classes (see groups.py)

from planaria.agent.execution import groups
from planaria.contract import rendezvous

LOG = logging.getLogger(__name__)
# A watcher waits for its wake key at most this long; an epoch that lasts longer is watched
# again (a new wait), so no timeout is ever logged in practice.
WAIT_S = 24 * 3600.0
# `stop` waits this long for the woken thread to end (a store round trip; bounded so that a
# store that neither answers nor closes cannot hold the worker up).
STOP_JOIN_S = 5.0


class Watcher:
    """Watches `epoch` (module docstring) on a store client of its own from `connect`; `own`
    is the worker's store client (prefixed with the epoch's key prefix), used by `stop` from
    the worker's thread: a client's requests are serialised, so the watcher's blocked wait
    would hold up a `set` on its own client."""

    def __init__(
        self,
        connect: Callable[[], c10d.Store],
        key_prefix: str,
        epoch: groups.Epoch,
        own: c10d.Store,
    ) -> None:
        self.failed = threading.Event()
        self._connect, self._prefix, self._epoch, self._own = connect, key_prefix, epoch, own
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._run, name=f"planaria-watch-{epoch.number}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (the worker leaves the epoch): wake the thread through its key and
        wait (at most STOP_JOIN_S) until it has ended (module docstring)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        with contextlib.suppress(RuntimeError):  # the store is gone; so is the thread's wait
            self._own.set(rendezvous.wake_key(self._epoch.rank), "left")
        if threading.current_thread() is not self._thread:
            self._thread.join(STOP_JOIN_S)
            if self._thread.is_alive():
                LOG.warning(
                    "epoch %d: the failure watcher did not end within %g s of its stop",
                    self._epoch.number,
                    STOP_JOIN_S,
                )

    def _run(self) -> None:
        try:
            store = c10d.PrefixStore(self._prefix, self._connect())
        except RuntimeError as exc:
            LOG.warning("epoch %d: cannot watch for failures: %s", self._epoch.number, exc)
            return
        key = rendezvous.wake_key(self._epoch.rank)
        while True:
            try:
                store.wait([key], datetime.timedelta(seconds=WAIT_S))
                failed = store.check([rendezvous.FAILED_KEY])
            except RuntimeError as exc:
                if _timed_out(exc):
                    continue
                return  # the controller's store went away
            with self._lock:
                if self._stopped or not failed:
                    return
                self.failed.set()
                self._epoch.release()
            return


def _timed_out(exc: RuntimeError) -> bool:
    return isinstance(exc, dist.DistStoreError)
