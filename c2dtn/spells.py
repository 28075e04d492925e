"""Logging a condition that lasts (a full disk, a file that cannot be written) once, not
once per message: an edge box whose disk stays full for a day must not write a log line
per refused publish into a journal that is often on that same disk."""

from __future__ import annotations

import logging
import time


class Spell:
    """hit() while the condition holds: the first hit is logged, later ones are counted and
    summed up every `every_s`; over() when it ends logs how many there were."""

    def __init__(self, log: logging.Logger, level: int = logging.WARNING, every_s: float = 60.0, clock=time.monotonic):
        self.log, self.level, self.every_s, self.clock = log, level, every_s, clock
        self.count = 0  # hits in this spell
        self.since = 0.0
        self._told = 0.0  # when it was last logged
        self._told_count = 0

    def hit(self, msg: str, *args) -> None:
        now = self.clock()
        self.count += 1
        if self.count == 1:
            self.since = self._told = now
            self._told_count = 1
            self.log.log(self.level, msg + " (logged once while this lasts)", *args)
        elif now - self._told >= self.every_s:
            self.log.log(
                self.level,
                msg + " (%d more times in the last %.0f s; %.0f s since it began)",
                *args,
                self.count - self._told_count,
                now - self._told,
                now - self.since,
            )
            self._told, self._told_count = now, self.count

    def over(self, msg: str, *args) -> None:
        """The condition ended: log msg with, appended, how many hits and for how long."""
        if self.count:
            self.log.info(msg + " (after %d times in %.0f s)", *args, self.count, self.clock() - self.since)
            self.count = 0
