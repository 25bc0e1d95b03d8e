"""The rank's heartbeat for `mf launch`'s hang watchdog (training.hang_timeout_s).

Under `mf launch` (mf_parallel's launcher) every rank beats once a second from a thread, and the
Trainer records the step and phase it is in; a rank silent for longer than hang_timeout_s ends
the job with a line naming it and its step. Without a launcher (a one-process `mf train`, or
msrun started by hand) nobody watches: the preflight says so once when hang_timeout_s is set
(preflight/features.py), and no heartbeat is started.
"""

from __future__ import annotations

SETTING = "training.hang_timeout_s"


def watch_for_hangs(timeout_s: float):
    """This process's heartbeat (mf_parallel.Heartbeat), or None where no launcher watches."""
    from mf_parallel import start_heartbeat

    return start_heartbeat(timeout_s, SETTING)
