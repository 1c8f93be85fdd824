"""Ray's memory-monitor report read into one line, on the exact messages Ray 2.60 gave on this
machine (ray_messages/: the str() of the OutOfMemoryError a call of the killed actor raised, with
RAY_memory_usage_threshold set just above the node's use and an actor allocating until killed)."""

from pathlib import Path

import pytest

from grpo_ray.cluster.memory_kills import Victim, memory_kill_line, parse_memory_kill, role_kind

MESSAGES = Path(__file__).parent / "ray_messages"
IN_A_CALL = (MESSAGES / "oom_actor_in_a_call.txt").read_text()
IN_ITS_CONSTRUCTOR = (MESSAGES / "oom_actor_in_its_constructor.txt").read_text()


def test_the_node_figures_the_threshold_and_the_victim_of_a_kill_in_a_call():
    kill = parse_memory_kill(IN_A_CALL)
    # "was 3.47GB used / 23.54GB limit"; "exceeded threshold of 3548820992B (14.0% of 25276502016B limit)"
    assert (kill.used_gb, kill.limit_gb) == (3.47, 23.54)
    assert kill.threshold == pytest.approx(3548820992 / 25276502016)  # 0.1404
    # "Selected to kill: (Actor(927f...): ..., task name=Hog.__init__, ..., pid=8241, actual memory used=0.47GB"
    assert kill.victims == (Victim("927f9b00581dd332f2717f7901000000", "Hog", 8241, 0.47),)
    assert kill.victim("927f9b00581dd332f2717f7901000000") == kill.victim() == kill.victims[0]
    assert kill.victim("another actor") is None


def test_a_victim_still_in_its_constructor_has_no_actor_id_but_its_class():
    kill = parse_memory_kill(IN_ITS_CONSTRUCTOR)
    assert (kill.used_gb, kill.limit_gb) == (6.96, 23.54)
    assert kill.threshold == pytest.approx(7340296192 / 25276502016)  # 0.2904
    assert kill.victims == (Victim(None, "Hog", 5451, 0.04),)


def test_the_line_names_the_role_what_it_held_the_node_against_the_threshold_and_what_to_lower():
    kill = parse_memory_kill(IN_A_CALL)
    line = memory_kill_line(kill, "rollout-1", kill.victim())
    # 3.47 / 23.54 = 14.7%; 3548820992 / 25276502016 = 14.0%
    assert line == (
        "rollout-1 (process 8241) was killed by Ray's memory monitor holding 0.47 GB: the node used 3.47 of "
        "23.54 GB (14.7%), over Ray's kill threshold of 14.0%; lower rollout.samples_per_prompt, "
        "rollout.max_new_tokens or rollout.num_workers (vllm: rollout.vllm.cpu_kv_cache_gb), or run fewer "
        "jobs on this machine (raising RAY_memory_usage_threshold is the last resort)"
    )
    assert "\n" not in line and "Refer to the documentation" not in line


def test_a_learner_is_told_its_own_settings():
    kill = parse_memory_kill(IN_ITS_CONSTRUCTOR)
    line = memory_kill_line(kill, "learner-0", kill.victim())
    assert line.startswith("learner-0 (process 5451) was killed by Ray's memory monitor holding 0.04 GB: ")
    assert "; lower learner.micro_batch_size (or learner.max_tokens_per_micro_batch), or set " in line


def test_a_figure_the_message_lacks_is_left_out_never_guessed():
    # Only the report's first sentence: no node figures, no threshold, no victim list.
    first = IN_A_CALL.split(" Memory on the node")[0]
    kill = parse_memory_kill(first)
    assert (kill.used_gb, kill.limit_gb, kill.threshold, kill.victims) == (None, None, None, ())
    assert memory_kill_line(kill, "reward-1", kill.victim()) == (
        "reward-1 was killed by Ray's memory monitor; lower reward.num_workers or reward.processes_per_worker, "
        "or run fewer jobs on this machine (raising RAY_memory_usage_threshold is the last resort)"
    )


def test_a_victim_known_only_by_its_class_is_named_by_its_role():
    kill = parse_memory_kill(IN_ITS_CONSTRUCTOR.replace("task name=Hog.__init__", "task name=LearnerWorker.__init__"))
    assert memory_kill_line(kill, None, kill.victim()).startswith(
        "a learner worker (process 5451) was killed by Ray's memory monitor holding 0.04 GB"
    )


def test_other_errors_are_no_memory_kill_and_roles_are_read_from_names():
    assert parse_memory_kill("The actor died unexpectedly before finishing this task.") is None
    assert [role_kind(n) for n in ("rollout-3", "teacher-t", "reward_model", "reference", "learner-1")] == [
        "rollout",
        "teacher",
        "reward_model",
        "reference",
        "learner",
    ]
