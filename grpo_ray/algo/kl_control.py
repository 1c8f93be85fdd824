"""The KL coefficient over a run: fixed, or the adaptive controller of Ziegler et al. (2019).

    controller = KLController("adaptive", coef=0.05, target=0.02, horizon=10000)
    coef = controller.coef                 # the coefficient step t trains with (logged as kl/coef)
    controller.update(observed_kl, n)      # after step t: n completions showed this mean KL

Adaptive (the classic PPO controller, as in Ziegler et al.'s lm-human-preferences and TRL):

    error = clip(kl / target - 1, -0.2, 0.2)
    coef <- coef * (1 + error * n / horizon)

so a KL above target raises the coefficient, below lowers it, by at most 20% per `horizon`
completions. `horizon` counts completions (TRL's n_steps is the batch size), so the pace of the
controller does not depend on how a step's batch is cut. The KL it sees is the one the penalty
uses: the per-token mean (kl_placement: loss) or the per-completion sum (kl_placement: reward).
Its state is the coefficient; it goes into checkpoints, so a resumed run goes on with it.
"""

from __future__ import annotations

import math
from enum import Enum


class KLControl(str, Enum):
    FIXED = "fixed"
    ADAPTIVE = "adaptive"


# The largest relative step of the classic controller per horizon of samples.
ADAPTIVE_CLIP = 0.2


def adaptive_kl_coef(coef: float, kl: float, target: float, n_samples: int, horizon: float) -> float:
    """The coefficient after a step with mean KL `kl` over `n_samples` completions."""
    if target <= 0 or horizon <= 0:
        raise ValueError(f"target and horizon must be > 0; got {target}, {horizon}")
    if not math.isfinite(kl):  # a step without a KL measurement (all rows out of the loss) changes nothing
        return coef
    error = min(max(kl / target - 1.0, -ADAPTIVE_CLIP), ADAPTIVE_CLIP)
    return coef * (1.0 + error * n_samples / horizon)


class KLController:
    def __init__(self, kind: KLControl | str, coef: float, target: float | None = None, horizon: float | None = None):
        self.kind = KLControl(kind)
        self.coef = float(coef)
        self.target = target
        self.horizon = horizon
        if self.kind is KLControl.ADAPTIVE and (target is None or horizon is None):
            raise ValueError("the adaptive KL controller needs a target and a horizon")

    def update(self, kl: float, n_samples: int) -> float:
        """Take the step's observed KL; returns the coefficient of the next step."""
        if self.kind is KLControl.ADAPTIVE:
            self.coef = adaptive_kl_coef(self.coef, kl, self.target, n_samples, self.horizon)
        return self.coef

    def state_dict(self) -> dict:
        return {"kind": self.kind.value, "coef": self.coef}

    def load_state_dict(self, state: dict) -> None:
        # A checkpoint of a fixed-coefficient run resumed with the adaptive controller starts it from
        # the recipe's coefficient, which is what the fixed run trained with: nothing to restore then.
        if state.get("kind") == self.kind.value:
            self.coef = float(state["coef"])
