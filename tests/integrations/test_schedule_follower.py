"""The scheduler's step methods follow the mode (`scheduler_lpc.ScheduleFollower`): without a
predictor board or a request log, `schedule` is vLLM's own outside shadow mode."""

from __future__ import annotations

import gc
from typing import Any

from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.scheduler_lpc import ScheduleFollower


class Scheduler:
    """A scheduler's step method as the class has it: the override, and vLLM's bound one."""

    def __init__(self) -> None:
        self._stock_schedule = self.stock

    def schedule(self) -> str:
        return "override"

    def stock(self) -> str:
        return "stock"


def test_schedule_is_vllms_outside_shadow_mode_and_the_override_in_it() -> None:
    switch = ModeSwitch("lpc")
    scheduler = Scheduler()
    switch.attach(ScheduleFollower(scheduler))
    seen: list[Any] = [scheduler.schedule()]
    for mode in ("shadow", "lru", "shadow", "lpc"):
        switch.set(mode, "test")
        seen.append(scheduler.schedule())
    assert seen == ["stock", "override", "stock", "override", "stock"]


def test_a_shadow_start_keeps_the_override_and_a_gone_scheduler_is_let_go() -> None:
    switch = ModeSwitch("shadow")
    scheduler = Scheduler()
    switch.attach(ScheduleFollower(scheduler))
    assert scheduler.schedule() == "override" and "schedule" not in vars(scheduler)
    del scheduler
    gc.collect()
    assert switch.set("lpc", "test")  # the follower of a collected scheduler does nothing
