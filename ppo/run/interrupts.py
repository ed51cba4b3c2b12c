"""Ctrl-C stops a training run, even when Python swallows the first KeyboardInterrupt.

Python turns SIGINT into a KeyboardInterrupt at whatever line the main thread is running.
When that line is inside a finaliser (a ``__del__``, a weakref callback, a garbage-collection
pass), the interpreter prints "Exception ignored in ..." and carries on: a run told to stop
would train on to its last step. `CtrlCWatch` keeps the usual behaviour (the interrupt is
raised at once) and also records it; `CtrlCWatch.check`, called once per step by the loop,
raises it again if it was lost, so the run stops at the end of that step at the latest.

A process started with SIGINT ignored (a shell's background job, a pytest-xdist worker's
child) keeps ignoring it: Python installs no KeyboardInterrupt for an ignored SIGINT, and the
watch does not either, as the parent asked.
"""

from __future__ import annotations

import signal
import threading


class CtrlCWatch:
    """Context manager around the training loop: SIGINT is raised as KeyboardInterrupt and
    remembered; `check` re-raises a remembered one. Outside the main thread, or when another
    SIGINT handler than Python's default is installed, it changes nothing."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handler(self, signum, frame):
        self.requested = True
        raise KeyboardInterrupt

    def __enter__(self) -> "CtrlCWatch":
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def check(self) -> None:
        """Raise KeyboardInterrupt if Ctrl-C was pressed and its exception got lost."""
        if self.requested:
            raise KeyboardInterrupt
