"""When Ray's memory monitor kills one of the run's actors: which one, what it held, what to lower.

Ray's raylet kills workers once the node's memory passes its threshold (RAY_memory_usage_threshold,
0.95 by default) and answers their calls with OutOfMemoryError, whose message is a report of about
forty lines: the node's figures first, the victims in the middle, a paragraph of advice last. Ray
2.60 writes (copied from a real kill on this machine; tests/unit/cluster/test_memory_kills.py holds
whole ones):

    1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2,
    ID: 6387...) was 5.92GB used / 23.54GB limit (0.251688)
    OOM kill reason: Memory usage 6337048576B exceeded threshold of 6334291456B (25.1% of 25276502016B limit)
    ...
    Selected to kill: (Actor(ba9d...01000000): job ID=01000000, lease ID=..., task name=Hog.__init__,
    required resources={}, pid=4832, actual memory used=0.56GB, worker ID=...)

A victim still in its constructor is "(Task: job ID=..." with no actor id; its task name still names
its class. Its last line, the advice paragraph, is what a run printed before ("error: an actor
failed: Refer to the documentation on how to address the out of memory issue: ..."). Pure: no Ray,
so that the parsing is tested on Ray's real strings without a cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The words that tell a memory-monitor kill from any other death, whatever error type carries them.
KILLED_FOR_MEMORY = "were killed due to the node running low on memory"

_NODE = re.compile(r"Memory on the node \(.*?\) was (?P<used>[\d.]+)GB used / (?P<limit>[\d.]+)GB limit")
_THRESHOLD = re.compile(r"exceeded threshold of (?P<threshold>\d+)B \([\d.]+% of (?P<limit>\d+)B limit\)")
_VICTIM = re.compile(
    r"\((?:Actor\((?P<actor>[0-9a-f]+)\)|Task): .*?task name=(?P<task>[^,]+),.*?pid=(?P<pid>\d+), "
    r"actual memory used=(?P<held>[\d.]+)GB"
)

# The role of each actor class (cluster/roles.py spawns them), for a victim known only by its task name.
ROLE_OF_CLASS = {
    "LearnerWorker": "learner",
    "RolloutWorker": "rollout",
    "RewardWorker": "reward",
    "ReferenceWorker": "reference",
    "TeacherWorker": "teacher",
    "RewardModelWorker": "reward_model",
}

# What lowers each role's own memory (host memory, which is what Ray's monitor watches: offloading a
# GPU's state to the CPU or a larger vLLM gpu_memory_utilization would not help, so neither is named).
KNOBS = {
    "learner": "learner.micro_batch_size (or learner.max_tokens_per_micro_batch), "
    "or set learner.gradient_checkpointing",
    "rollout": "rollout.samples_per_prompt, rollout.max_new_tokens or rollout.num_workers "
    "(vllm: rollout.vllm.cpu_kv_cache_gb)",
    "reward": "reward.num_workers or reward.processes_per_worker",
    "reference": "learner.micro_batch_size (the reference scores in the learners' micro-batches)",
    "teacher": "learner.micro_batch_size (a teacher scores in the learners' micro-batches; vllm: its cpu_kv_cache_gb)",
    "reward_model": "reward.model.batch_size",
}
_LAST_RESORT = "or run fewer jobs on this machine (raising RAY_memory_usage_threshold is the last resort)"


@dataclass(frozen=True)
class Victim:
    """One worker Ray killed: its actor id (hex; None while its constructor ran), its class, process
    and the memory Ray measured it held."""

    actor_id: str | None
    class_name: str
    pid: int
    held_gb: float


@dataclass(frozen=True)
class MemoryKill:
    """One kill's figures, each None where Ray's message lacks it (never guessed)."""

    used_gb: float | None  # the node's memory in use when Ray killed, in Ray's GB (2**30 bytes)
    limit_gb: float | None  # the node's memory Ray counts against
    threshold: float | None  # Ray's kill threshold, a fraction of the limit
    victims: tuple[Victim, ...]

    def victim(self, actor_id: str | None = None) -> Victim | None:
        """The victim of `actor_id`, else the only one (None when there are several or none)."""
        for victim in self.victims:
            if actor_id is not None and victim.actor_id == actor_id:
                return victim
        return self.victims[0] if len(self.victims) == 1 and actor_id is None else None


def parse_memory_kill(message: str) -> MemoryKill | None:
    """The figures of Ray's memory-monitor report `message`; None when it is no such report."""
    if KILLED_FOR_MEMORY not in message:
        return None
    node, threshold = _NODE.search(message), _THRESHOLD.search(message)
    victims = tuple(
        Victim(m["actor"], m["task"].split(".")[0].strip(), int(m["pid"]), float(m["held"]))
        for m in _VICTIM.finditer(message)
    )
    return MemoryKill(
        used_gb=float(node["used"]) if node else None,
        limit_gb=float(node["limit"]) if node else None,
        threshold=int(threshold["threshold"]) / int(threshold["limit"]) if threshold else None,
        victims=victims,
    )


def role_kind(name: str) -> str:
    """ "rollout-3" -> "rollout", "teacher-t" -> "teacher", "reward_model" -> "reward_model"."""
    kind = name.split("-")[0]
    return kind if kind in KNOBS else name


def victim_kind(name: str | None, victim: Victim | None) -> str | None:
    """The victim's role: from its name in the run, else from its class; None when neither is known."""
    if name:
        return role_kind(name)
    return ROLE_OF_CLASS.get(victim.class_name) if victim else None


def killed_text(kill: MemoryKill, name: str | None, victim: Victim | None) -> str:
    """What happened: who (`name`, else the victim's role), the memory it held, the node's use
    against Ray's threshold."""
    kind = victim_kind(name, victim)
    who = name or (f"a {kind} worker" if kind else "a worker of the run")
    if victim is not None:
        who += f" (process {victim.pid})"
    held = f" holding {victim.held_gb:.2f} GB" if victim is not None else ""
    node = ""
    if kill.used_gb is not None and kill.limit_gb is not None:
        node = f": the node used {kill.used_gb:.2f} of {kill.limit_gb:.2f} GB ({kill.used_gb / kill.limit_gb:.1%})"
        if kill.threshold is not None:
            node += f", over Ray's kill threshold of {kill.threshold:.1%}"
    return f"{who} was killed by Ray's memory monitor{held}{node}"


def advice(kind: str | None) -> str:
    """What to change: the role's own settings, then the machine, then Ray's threshold."""
    return (f"lower {KNOBS[kind]}, " if kind in KNOBS else "") + _LAST_RESORT


def memory_kill_line(kill: MemoryKill, name: str | None, victim: Victim | None) -> str:
    """The one line of a kill that ends the run: what happened, then what to change."""
    return f"{killed_text(kill, name, victim)}; {advice(victim_kind(name, victim))}"
