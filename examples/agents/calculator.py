"""A calculator as an environment for the tiny-tools recipe (configs/tiny-tools.yaml), written as
TRL's environment_factory expects one (reset(**row), public methods as tools), so it runs unchanged
in grpo-ray: the model calls multiply in the Qwen2.5/Hermes tool format, reads the result, answers.
"""


class Calculator:
    def reset(self, **row):
        self.calls = 0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: the first factor
            b: the second factor
        """
        self.calls += 1
        return int(a) * int(b)
