"""An environment of several turns for the tiny model: it answers a sum, and hears "higher" or
"lower" until it is right or its turns run out. Named in a recipe as
`environment.spec: examples/agents/higher_lower.py:HigherLower` (relative to the recipe's folder).
"""

from grpo_ray.envs import Environment, StepResult


class HigherLower(Environment):
    def __init__(self, reward_if_right: float = 1.0):
        self.reward_if_right = reward_if_right

    def reset(self, row):
        self.answer, self.right = int(row["answer"]), False
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text):
        guess = text.strip()
        if guess.lstrip("-").isdigit() and int(guess) == self.answer:
            self.right = True
            return StepResult([], done=True)
        hint = "higher" if guess.lstrip("-").isdigit() and int(guess) < self.answer else "lower"
        return StepResult([{"role": "user", "content": hint}])

    def reward(self):
        return self.reward_if_right if self.right else 0.0
