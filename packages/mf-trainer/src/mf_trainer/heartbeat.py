"""The rank's heartbeat for `mf launch`'s hang watchdog (training.hang_timeout_s).

Under `mf launch` (mf_parallel's launcher) every rank beats once a second from a thread, and the
Trainer records the step and phase it is in; a rank silent for longer than hang_timeout_s ends
the job with a line naming it and its step. Without a launcher (a one-process `mf train`, or
msrun started by hand) nobody watches: a hang_timeout_s set away from its default is then said
once, never silently ignored.
"""

from __future__ import annotations

import logging

log = logging.getLogger("mf_trainer")

DEFAULT_HANG_TIMEOUT_S = 600.0
SETTING = "training.hang_timeout_s"


def watch_for_hangs(timeout_s: float):
    """This process's heartbeat (mf_parallel.Heartbeat), or None where no launcher watches."""
    from mf_parallel import start_heartbeat

    beat = start_heartbeat(timeout_s, SETTING)
    if beat is None and timeout_s != DEFAULT_HANG_TIMEOUT_S:
        log.info("%s: %g s has nothing to watch here (no mf launch around this process: the hang watchdog is "
                 "the launcher's)", SETTING, timeout_s)
    return beat
