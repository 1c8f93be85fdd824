"""Whether a step's update moved the policy far past what the recipe's clip allows, and the console's line.

A user's Gemma 3 270M at learner.lr 2e-5 moved its probe's log-probs by 3.3 nats in one update,
entropy fell from 0.97 to 0.16 and held-out accuracy to 0.01 by step 4, and the console said nothing.
With one update per batch the clip never binds (algo/policy_move.py), so the learning rate alone
sets how far a step goes; this says so the step it happens, naming learner.lr and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_ray.algo.policy_move import clip_log_bound

# A step is far when update/moved (mean |log pi_new - log pi_old| of the sampled tokens) is over FAR x
# the clip's nearer |log ratio| bound (0.18 nats at 0.2): 0.55 nats. SmolLM2-135M, 2 prompts x 8, the
# same first batch (2026-11-29): 0.11 at lr 1e-5 (tuned; 0.6x; the next steps 0.07, 0.08), 0.23 at 2e-5
# (still learning; 1.2x; then 0.14, 0.13), 1.01 at 1e-4 (5.5x) and 2.06 at 3e-4 (11x), after both of
# which no group's rewards differed (loss 0) from step 2 on. Gemma 3 270M at the user's 2e-5, 8 prompts
# x 8: 1.27 (7x), entropy 0.65 -> 0.17 in one step; at its recipe's 2e-6 (learns) 0.16 then 0.11. 3x stands
# 2.5x above the healthy figures (a smaller batch is noisier) and well under the collapsing ones.
FAR = 3.0
# After a line, the next comes only when a step moves WORSE x as far as the last said (the run is
# getting worse: news), or when a far step comes QUIET_STEPS or more after the last line (a new
# occurrence, e.g. a schedule's peak reached later). A run that collapses moves far for several steps
# running; a line each step would bury the step lines and say nothing new. MLflow has every step.
WORSE = 2.0
QUIET_STEPS = 50


def far_move_line(step: int, moved: float, clip_low: float, clip_high: float, lr: float) -> str | None:
    """The console's warning when `moved` (update/moved, nats) is far past the clip; None otherwise.
    lr: learner.lr's value, the usual cause."""
    bound = clip_log_bound(clip_low, clip_high)
    if not moved > FAR * bound:  # NaN (no loss tokens measured) is not far
        return None
    return (
        f"warning: step {step}: the update moved the sampled tokens' log-probs by {moved:.2f} nats on average "
        f"(update/moved), {moved / bound:.0f}x the {bound:.2f} the clip allows (algorithm.clip_low {clip_low:g}, "
        f"clip_high {clip_high:g}): a move that collapses the policy within steps. The usual cause is the "
        f"learning rate, learner.lr {lr:g}: lower it 3-10x ({lr / 3:.1e} to {lr / 10:.1e})"
    )


@dataclass
class FarMoveWatch:
    """Says a far step once per occurrence (see WORSE and QUIET_STEPS)."""

    clip_low: float
    clip_high: float
    lr: float
    said_step: int | None = None
    said_moved: float = 0.0

    def line(self, step: int, metrics: dict[str, float]) -> str | None:
        """The warning for this step's metrics, when it is far and news; None otherwise."""
        moved = metrics.get("update/moved", float("nan"))
        text = far_move_line(step, moved, self.clip_low, self.clip_high, self.lr)
        if text is None:
            return None
        news = self.said_step is None or moved >= WORSE * self.said_moved or step - self.said_step >= QUIET_STEPS
        if not news:
            return None
        self.said_step, self.said_moved = step, moved
        return text
