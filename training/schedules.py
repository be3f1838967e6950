"""Learning-rate schedules, counted in optimizer updates (not micro-batches, not ranks).

Each schedule is a multiplier of the peak learning rate ``lr`` given to the optimizer:

- ``inverse_sqrt`` (Vaswani et al. 2017, section 5.3): linear warm-up to ``lr`` over
  ``warmup_steps`` updates, then decay proportional to the inverse square root of the step,
  ``lr * sqrt(warmup_steps / step)``. The paper writes the same curve as
  ``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``; here the peak is named directly
  (``lr = d_model^-0.5 * warmup^-0.5`` gives the paper's numbers), as fairseq does.
- ``linear``: linear warm-up, then linear decay to 0 at ``total_steps``.
- ``linear_time``: linear warm-up, then linear decay to 0 when the training time budget
  (``max_time_minutes``) runs out, measured in wall-clock seconds from the end of warm-up (or
  at ``total_steps``, if that comes first). A time-limited run is then annealed to 0 however
  fast the host happens to be, where ``linear`` needs ``max_steps`` guessed from its speed (a
  guess that is too high stops the run before the rate has decayed, one too low leaves time
  unused). The clock lives in :class:`TimeBudget`; the training loop reports the time to it after
  every update (one process) or at its log interval (several ranks, all with the slowest rank's
  time, so that they keep the same rate). The rate then depends on the wall
  clock: a resumed run does not repeat an uninterrupted one exactly.
- ``constant``: linear warm-up, then ``lr``.
- ``plateau``: linear warm-up, then ``lr`` times ``factor`` each time the validation metric
  has not improved for ``patience`` validations in a row (the RNN recipe of Luong et al. 2015
  and JoeyNMT's default). The decay state lives in :class:`PlateauDecay`.

Each schedule is one entry of ``_FACTORS`` below, made into a ``torch.optim.lr_scheduler.LambdaLR``
by :func:`build_scheduler`. The trainer holds a :class:`LearningRateSchedule`: the ``LambdaLR``,
the plateau state and the clock together, checkpointed together (``training_state.pt``), stepped
once per optimizer update (deliberately not through ``accelerator.prepare``: Accelerate's
scheduler wrapper steps once per process, which would make the curve depend on the number of
GPUs).
"""

from __future__ import annotations

import math

import torch


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warm-up multiplier: ``step / warmup_steps`` below ``warmup_steps``, else 1.

    ``step`` counts finished updates, so the first update (step 0) uses ``1 / warmup_steps``
    rather than a learning rate of exactly zero.
    """
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


def inverse_sqrt_factor(step: int, warmup_steps: int) -> float:
    """``min((step+1)/warmup, sqrt(warmup/(step+1)))``; 1 at the end of warm-up."""
    n = step + 1
    if warmup_steps <= 0:
        return 1.0 / math.sqrt(n)
    return min(n / warmup_steps, math.sqrt(warmup_steps / n))


def linear_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Warm-up, then ``(total - step) / (total - warmup)``, floored at 0."""
    if step < warmup_steps:
        return warmup_factor(step, warmup_steps)
    remaining = max(1, total_steps - warmup_steps)
    return max(0.0, (total_steps - step) / remaining)


class PlateauDecay:
    """Multiplies the learning rate by ``factor`` after ``patience`` validations without improvement.

    Args:
        factor: multiplier applied at each decay, in (0, 1).
        patience: number of consecutive validations without improvement that trigger a decay.
        higher_is_better: True for BLEU/chrF, False for loss.
        min_multiplier: the multiplier never falls below this.

    ``state_dict``/``load_state_dict`` make it checkpointable with
    ``accelerator.register_for_checkpointing``.
    """

    def __init__(
        self, factor: float = 0.5, patience: int = 2, higher_is_better: bool = True, min_multiplier: float = 1e-3
    ):
        if not 0.0 < factor < 1.0:
            raise ValueError(f"plateau_factor must be in (0, 1); got {factor}")
        if patience < 1:
            raise ValueError(f"plateau_patience must be >= 1; got {patience}")
        self.factor = factor
        self.patience = patience
        self.higher_is_better = higher_is_better
        self.min_multiplier = min_multiplier
        self.multiplier = 1.0
        self.best: float | None = None
        self.bad_validations = 0

    def observe(self, value: float) -> bool:
        """Record one validation result; returns True if the learning rate was just decayed."""
        improved = self.best is None or (value > self.best if self.higher_is_better else value < self.best)
        if improved:
            self.best = value
            self.bad_validations = 0
            return False
        self.bad_validations += 1
        if self.bad_validations >= self.patience:
            self.multiplier = max(self.min_multiplier, self.multiplier * self.factor)
            self.bad_validations = 0
            return True
        return False

    def state_dict(self) -> dict:
        return {"multiplier": self.multiplier, "best": self.best, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict) -> None:
        self.multiplier = state["multiplier"]
        self.best = state["best"]
        self.bad_validations = state["bad_validations"]


class TimeBudget:
    """The wall-clock side of the ``linear_time`` schedule: the fraction of the time budget left
    after warm-up.

    Args:
        budget_s: the training time budget in seconds (``60 * max_time_minutes``).

    :meth:`observe` is called with the elapsed training time; the first call at or after the
    last warm-up update fixes the start of the decay. ``state_dict``/``load_state_dict`` make it
    checkpointable, so a resumed run continues the same line.

    Raises:
        ValueError: ``budget_s`` not positive.
    """

    def __init__(self, budget_s: float):
        if not budget_s > 0:
            raise ValueError(f"the time budget must be positive (max_time_minutes > 0); got {budget_s} s")
        self.budget_s = float(budget_s)
        self.elapsed_s = 0.0
        self.decay_start_s: float | None = None

    def observe(self, elapsed_s: float, step: int, warmup_steps: int) -> None:
        """Record ``elapsed_s`` seconds of training after ``step`` finished updates."""
        self.elapsed_s = float(elapsed_s)
        if self.decay_start_s is None and step >= warmup_steps:
            self.decay_start_s = self.elapsed_s

    def remaining_fraction(self) -> float:
        """``(budget - elapsed) / (budget - decay start)`` in [0, 1]; 1 before the decay starts."""
        if self.decay_start_s is None:
            return 1.0
        span = max(1e-9, self.budget_s - self.decay_start_s)
        return min(1.0, max(0.0, (self.budget_s - self.elapsed_s) / span))

    def state_dict(self) -> dict:
        return {"budget_s": self.budget_s, "elapsed_s": self.elapsed_s, "decay_start_s": self.decay_start_s}

    def load_state_dict(self, state: dict) -> None:
        """Restore the clock; the budget stays the one this object was built with, so a run
        resumed with a new ``max_time_minutes`` decays towards the new end (and stops there)."""
        self.elapsed_s = state["elapsed_s"]
        self.decay_start_s = state["decay_start_s"]


def _linear_time_factor(step: int, warmup_steps: int, total_steps: int | None, time_budget: TimeBudget) -> float:
    by_steps = linear_factor(step, warmup_steps, total_steps) if total_steps else warmup_factor(step, warmup_steps)
    return by_steps if step < warmup_steps else min(by_steps, time_budget.remaining_fraction())


# name -> multiplier of the peak rate after `step` updates: f(step, warmup_steps, total_steps,
# plateau, time_budget). A new schedule is one entry here (and, if it keeps state, a field of
# LearningRateSchedule, which the loop tells about updates, clock readings and validations).
_FACTORS = {
    "inverse_sqrt": lambda step, warmup, total, plateau, clock: inverse_sqrt_factor(step, warmup),
    "linear": lambda step, warmup, total, plateau, clock: linear_factor(step, warmup, total),
    "linear_time": lambda step, warmup, total, plateau, clock: _linear_time_factor(step, warmup, total, clock),
    "constant": lambda step, warmup, total, plateau, clock: warmup_factor(step, warmup),
    "plateau": lambda step, warmup, total, plateau, clock: warmup_factor(step, warmup) * plateau.multiplier,
}
SCHEDULES = tuple(_FACTORS)  # the valid `schedule` values


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    name: str,
    warmup_steps: int,
    total_steps: int | None = None,
    plateau: PlateauDecay | None = None,
    time_budget: TimeBudget | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` implementing schedule ``name`` (one of :data:`SCHEDULES`).

    Args:
        optimizer: the optimizer whose ``lr`` is the peak learning rate.
        name: ``"inverse_sqrt"``, ``"linear"``, ``"linear_time"``, ``"constant"`` or ``"plateau"``.
        warmup_steps: updates of linear warm-up (0 disables warm-up).
        total_steps: number of updates of the run; required by ``"linear"``, optional for
            ``"linear_time"`` (the decay then ends at whichever limit comes first).
        plateau: the decay state; required by ``"plateau"``.
        time_budget: the clock; required by ``"linear_time"``.

    Raises:
        ValueError: unknown ``name``, or a missing ``total_steps`` / ``plateau`` / ``time_budget``.
    """
    if name not in _FACTORS:
        raise ValueError(f"schedule must be one of {', '.join(repr(s) for s in SCHEDULES)}; got {name!r}")
    if name == "linear" and not total_steps:
        raise ValueError("schedule 'linear' needs a known number of updates: set max_steps (or max_epochs)")
    if name == "linear_time" and time_budget is None:
        raise ValueError("schedule 'linear_time' needs a time budget: set max_time_minutes")
    if name == "plateau" and plateau is None:
        raise ValueError("schedule 'plateau' needs a PlateauDecay object")
    factor = _FACTORS[name]

    def fn(step: int) -> float:
        return factor(step, warmup_steps, total_steps, plateau, time_budget)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


class LearningRateSchedule:
    """The run's learning-rate schedule with all its state: the ``LambdaLR`` multiplier, the
    plateau decay and the time budget of ``linear_time``, checkpointed together.

    The training loop tells it what happened and nothing else: :meth:`step` after each optimizer
    update, :meth:`observe_time` whenever it reads the clock, :meth:`observe_validation` after
    each validation; what a schedule does with that is its own business (only ``plateau`` reads
    validations, only ``linear_time`` reads the clock).

    Args:
        optimizer: the optimizer whose ``lr`` is the peak learning rate.
        name: one of :data:`SCHEDULES`.
        warmup_steps: updates of linear warm-up.
        total_steps: updates of the run, if known (required by ``"linear"``).
        plateau_factor, plateau_patience, higher_is_better: :class:`PlateauDecay`'s arguments.
        time_budget_s: the training time budget in seconds (required by ``"linear_time"``).

    Raises:
        ValueError: as :func:`build_scheduler`, :class:`PlateauDecay` and :class:`TimeBudget`.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        name: str,
        warmup_steps: int,
        total_steps: int | None = None,
        *,
        plateau_factor: float = 0.5,
        plateau_patience: int = 2,
        higher_is_better: bool = True,
        time_budget_s: float | None = None,
    ):
        self.name, self.warmup_steps = name, warmup_steps
        self.plateau = PlateauDecay(plateau_factor, plateau_patience, higher_is_better)
        self.time_budget = TimeBudget(time_budget_s) if name == "linear_time" else None
        self.scheduler = build_scheduler(optimizer, name, warmup_steps, total_steps, self.plateau, self.time_budget)

    def step(self) -> None:
        """One optimizer update is done."""
        self.scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    @property
    def reads_clock(self) -> bool:
        """Whether the rate depends on the wall clock (``linear_time``): several ranks must then
        agree on the time, which the loop does at its log interval."""
        return self.time_budget is not None

    def observe_time(self, elapsed_s: float, step: int) -> None:
        """``elapsed_s`` seconds of training after ``step`` finished updates (``linear_time`` only)."""
        if self.time_budget is not None:
            self.time_budget.observe(elapsed_s, step, self.warmup_steps)

    def observe_validation(self, score: float) -> None:
        """The validation metric just measured (``plateau`` only)."""
        if self.name == "plateau":
            self.plateau.observe(score)

    def state_dict(self) -> dict:
        state = {"lr_scheduler": self.scheduler.state_dict(), "plateau": self.plateau.state_dict()}
        if self.time_budget is not None:
            state["time_budget"] = self.time_budget.state_dict()
        return state

    def load_state_dict(self, state: dict) -> bool:
        """Restore a :meth:`state_dict`. Returns False when this schedule keeps a clock
        (``linear_time``) but ``state`` has none (a run switched to it on resume, or a checkpoint
        written without it): the decay then starts at the resumed update."""
        self.scheduler.load_state_dict(state["lr_scheduler"])
        self.plateau.load_state_dict(state["plateau"])
        if self.time_budget is None:
            return True
        if "time_budget" not in state:
            return False
        self.time_budget.load_state_dict(state["time_budget"])
        return True
