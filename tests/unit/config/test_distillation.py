"""The recipe's `distillation` section: teachers, each an actor and a role of the plan of its own,
rows routed to at most one teacher, and the teachers' signal alone (no reward function) allowed."""

import pytest

from grpo_ray.config import Config, ConfigError, config_from_dict, plan_resources
from grpo_ray.config.memory import memory_plan

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
        (
            teachers({"name": "big"}),
            "distillation.teachers.0.url: Value error, give model_path (a model run here) or url (a vLLM server's "
            "base url, http://host:8000/v1), exactly one of them (got None)",
        ),
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


SERVED = {"name": "far", "url": "http://10.0.0.7:8000/v1/", "model": "qwen-7b", "tokenizer": "tiny"}


def test_a_url_teacher_is_asked_over_http_and_holds_no_gpu_or_memory_here():
    cfg = config_from_dict(teachers(SERVED))
    teacher = cfg.distillation.teachers[0]
    assert (teacher.url, teacher.model_path, teacher.served) == ("http://10.0.0.7:8000/v1", None, True)
    assert (teacher.timeout_s, teacher.max_retries, teacher.max_failure_rate) == (60.0, 2, 0.5)
    roles = {role.role: role for role in plan_resources(cfg)}
    assert (roles["teacher-far"].num_cpus, roles["teacher-far"].num_gpus) == (0.5, 0)
    lines, warnings = memory_plan(cfg, 80)
    assert "teacher-far  served at http://10.0.0.7:8000/v1 (qwen-7b): no memory here" in lines and warnings == []


def test_a_vllm_teacher_takes_its_engines_share_of_the_gpu_in_the_memory_plan():
    # Qwen2.5-1.5B in bfloat16: 1,543,714,304 x 2 B = 2.88 GiB of weights; its engine takes 0.25 x 80 GiB.
    big = {"name": "big", "model_path": "Qwen/Qwen2.5-1.5B-Instruct", "backend": "vllm", "num_gpus": 1}
    cfg = config_from_dict({**teachers({**big, "gpu_memory_utilization": 0.25}), "model": {"dtype": "bfloat16"}})
    lines, warnings = memory_plan(cfg, 80)
    assert (
        "teacher-big  weights 2.88 GiB (Qwen/Qwen2.5-1.5B-Instruct); vLLM takes 20.00 GiB (gpu_memory_utilization "
        "0.25), KV cache 17.12 GiB"
    ) in lines and warnings == []
    # A GPU of 10 GiB: 0.25 of it (2.5 GiB) does not hold the weights.
    assert memory_plan(cfg, 10)[1] == [
        "teacher-big: the weights leave no KV cache in distillation.teachers.0.gpu_memory_utilization 0.25 of the "
        "GPU; raise it"
    ]
    # On the CPU: its weights, and the KV cache in host memory.
    cpu = config_from_dict({**teachers({**big, "num_gpus": 0}), "model": {"dtype": "bfloat16"}})
    assert (
        "teacher-big  weights 2.88 GiB (Qwen/Qwen2.5-1.5B-Instruct, on the CPU); vLLM's KV cache 1 GiB in host memory"
    ) in memory_plan(cpu, 80)[0]


@pytest.mark.parametrize(
    "entry, line",
    [
        (
            {**TINY_TEACHER, "url": "http://h:8000/v1"},
            "distillation.teachers.0.url: Value error, give model_path (a model run here) or url (a vLLM server's "
            "base url, http://host:8000/v1), exactly one of them (got 'http://h:8000/v1')",
        ),
        (
            {**SERVED, "url": "http://user:secret@h:8000/v1"},
            "distillation.teachers.0.url: Value error, not http(s)://host[:port]/path; a vLLM server's base url is "
            "http://host:8000/v1",
        ),
        ({**SERVED, "url": "h:8000/v1"}, "distillation.teachers.0.url: Value error, not http(s)://host[:port]/path"),
        (
            {**SERVED, "tokenizer": None},
            "distillation.teachers.0.tokenizer: Value error, a url teacher needs the tokenizer of the model its "
            "server runs (a local folder or hub id): the student's token ids are checked against it at start",
        ),
        (
            {**SERVED, "num_gpus": 1},
            "distillation.teachers.0.num_gpus: Value error, a url teacher's model runs on its server: its actor "
            "here takes no GPU; set 0",
        ),
        (
            {**SERVED, "backend": "vllm"},
            "distillation.teachers.0.backend: Value error, a url teacher runs on its server; backend is for a "
            "model_path teacher",
        ),
        (
            {**TINY_TEACHER, "timeout_s": 5},
            "distillation.teachers.0.timeout_s: Value error, timeout_s is for a url teacher (a model served "
            "elsewhere); this one runs model_path here",
        ),
        ({**TINY_TEACHER, "model": "x"}, "distillation.teachers.0.model: Value error, model is for a url teacher"),
        (
            {**TINY_TEACHER, "cpu_kv_cache_gb": 0.5},
            "distillation.teachers.0.cpu_kv_cache_gb: Value error, cpu_kv_cache_gb is an option of backend: vllm's "
            "engine; this teacher's backend is hf",
        ),
        ({**SERVED, "max_failure_rate": 0}, "distillation.teachers.0.max_failure_rate: Input should be greater than 0"),
    ],
)
def test_a_teacher_of_the_wrong_kind_of_fields_is_one_line_naming_the_field(entry, line):
    assert refused(teachers(entry)).startswith(line)
