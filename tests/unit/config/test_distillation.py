"""The recipe's `distillation` section: teachers, each an actor and a role of the plan of its own,
rows routed to at most one teacher, and the teachers' signal alone (no reward function) allowed."""

import pytest

from grpo_ray.config import Config, ConfigError, config_from_dict, plan_resources

TINY_TEACHER = {"name": "big", "model_path": "tiny"}


def teachers(*entries: dict, **section) -> dict:
    return {"distillation": {"teachers": list(entries), **section}}


def refused(raw: dict) -> str:
    with pytest.raises(ConfigError) as error:
        config_from_dict(raw)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_no_teachers_is_no_distillation_and_every_recipe_stays_as_it_was():
    cfg = Config()
    assert not cfg.use_distillation and cfg.distillation.teachers == ()
    assert [role.role for role in plan_resources(cfg)] == ["learner", "rollout", "reward"]


def test_a_teacher_is_a_role_of_its_own_with_its_resources_and_node_targeting():
    cfg = config_from_dict(
        teachers(
            {**TINY_TEACHER, "num_gpus": 0.5, "sources": ["gsm8k"], "resources": {"teacher_node": 1}},
            {"name": "rest", "model_path": "tiny", "num_cpus": 2},
        )
    )
    assert cfg.use_distillation and cfg.distillation.coef == 1.0 and cfg.distillation.with_rewards
    roles = {role.role: role for role in plan_resources(cfg)}
    assert list(roles)[-2:] == ["teacher-big", "teacher-rest"]
    big, rest = roles["teacher-big"], roles["teacher-rest"]
    assert (big.count, big.num_cpus, big.num_gpus, big.custom) == (1, 0.5, 0.5, {"teacher_node": 1})
    assert (rest.num_cpus, rest.num_gpus) == (2, 0)
    assert big.bundle() == {"CPU": 0.5, "GPU": 0.5, "teacher_node": 1}


def test_the_teachers_signal_alone_needs_no_reward_function():
    cfg = config_from_dict({**teachers(TINY_TEACHER, with_rewards=False), "reward": {"functions": []}})
    assert cfg.reward.functions == () and not cfg.distillation.with_rewards
    # Beside rewards, or without teachers, a run needs a reward function.
    assert refused({**teachers(TINY_TEACHER), "reward": {"functions": []}}) == (
        "reward.functions: empty, and distillation.with_rewards adds the GRPO advantage of the rewards; name a "
        "reward function, or set distillation.with_rewards: false to train on the teachers' signal alone"
    )
    assert refused({"reward": {"functions": []}}).startswith("reward.functions: needs at least one reward function")


@pytest.mark.parametrize(
    "raw, line",
    [
        (
            teachers(TINY_TEACHER, {"name": "big", "model_path": "tiny", "sources": ["math"]}),
            "distillation.teachers: names must be unique; got big, big",
        ),
        (
            teachers(TINY_TEACHER, {"name": "small", "model_path": "tiny"}),
            "distillation.teachers.1.sources: empty, as are teachers.0's (big); with several teachers at most one "
            "may leave sources empty (it teaches every row no other teacher takes): name the data_source values "
            "each of the others teaches",
        ),
        (
            teachers(
                {**TINY_TEACHER, "sources": ["gsm8k", "math"]}, {"name": "s", "model_path": "tiny", "sources": ["math"]}
            ),
            "distillation.teachers.1.sources: math is taught by teachers.0 (big) too; a row has one teacher at most, "
            "so name each source once",
        ),
        (
            {"distillation": {"with_rewards": False}},
            "distillation.with_rewards: false leaves the rewards out of the advantages, and distillation.teachers is "
            "empty, so nothing would train; add a teacher or set it to true",
        ),
        (teachers({**TINY_TEACHER, "name": "a b"}), "distillation.teachers.0.name: String should match pattern"),
        (teachers({"name": "big"}), "distillation.teachers.0.model_path: Field required"),
        (teachers(TINY_TEACHER, coef=0), "distillation.coef: Input should be greater than 0"),
        (
            teachers({**TINY_TEACHER, "sources": ["a", "a"]}),
            "distillation.teachers.0.sources: Value error, name each source once",
        ),
    ],
)
def test_teachers_that_cannot_run_are_refused_in_one_line(raw, line):
    assert refused(raw).startswith(line)


def test_one_teacher_beside_teachers_of_named_sources_teaches_the_rest():
    cfg = config_from_dict(teachers({**TINY_TEACHER, "sources": ["gsm8k"]}, {"name": "rest", "model_path": "tiny"}))
    assert [t.sources for t in cfg.distillation.teachers] == [("gsm8k",), ()]


@pytest.mark.parametrize(
    "sections, field",
    [
        ({"algorithm": {"dynamic_sampling": True}}, "algorithm.dynamic_sampling"),
        ({"polaris": {"substitution": True}}, "polaris.substitution"),
        ({"algorithm": {"kl_coef": 0.1, "kl_placement": "reward"}}, "algorithm.kl_placement"),
        ({"algorithm": {"overlong": "zero_reward"}}, "algorithm.overlong: zero_reward"),
    ],
)
def test_switches_that_work_on_rewards_are_refused_when_the_teachers_signal_trains_alone(sections, field):
    line = refused({**teachers(TINY_TEACHER, with_rewards=False), **sections})
    assert line.startswith(f"{field}: works on the rewards, which distillation.with_rewards: false leaves out")
    config_from_dict({**teachers(TINY_TEACHER), **sections})  # beside the rewards they work
