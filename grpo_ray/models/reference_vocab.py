"""A reference model other than the policy, and a teacher, must speak the policy's token ids.

The KL term compares the policy's and the reference's log-probs of the same token ids, token by
token, and distillation the student's and a teacher's. A model whose tokenizer maps a token to
another id (another model family, or the same family with other added tokens) would score other
tokens without any error: the KL would be noise. So the run is refused at start, in one line,
unless both tokenizers map every token to the same id (a teacher may know more tokens than the
student: it only scores the student's). The whole token -> id maps are compared,
not their sizes: two vocabularies of the same size can still differ. (Embedding sizes may differ:
Qwen2.5 3B and 7B pad their embedding matrices differently but share one tokenizer, which is what
counts.)
"""

from __future__ import annotations

from grpo_ray.models.hub import check_model_source
from grpo_ray.models.loading import ModelLoadError, load_tokenizer


def vocabulary_difference(
    policy: dict[str, int], other: dict[str, int], names: tuple[str, str] = ("the policy", "the reference")
) -> str | None:
    """None when both token -> id maps are equal, else a short description of the first difference,
    naming the two models as `names`.

    >>> vocabulary_difference({"a": 0, "b": 1}, {"a": 0, "b": 1}) is None
    True
    >>> vocabulary_difference({"a": 0, "b": 1}, {"a": 1, "b": 0})
    "2 of 2 tokens differ, e.g. 'a' is 0 for the policy and 1 for the reference"
    >>> vocabulary_difference({"a": 0}, {"a": 0, "c": 1}, ("the student", "the teacher"))
    "1 of 2 tokens differ, e.g. 'c' is absent for the student and 1 for the teacher"
    """
    if policy == other:
        return None
    tokens = sorted(set(policy) | set(other), key=lambda t: (min(policy.get(t, 1 << 62), other.get(t, 1 << 62)), t))
    differing = [t for t in tokens if policy.get(t) != other.get(t)]
    first = differing[0]
    show = lambda vocab: "absent" if first not in vocab else str(vocab[first])  # noqa: E731
    return (
        f"{len(differing)} of {len(tokens)} tokens differ, e.g. {first!r} is {show(policy)} for {names[0]} "
        f"and {show(other)} for {names[1]}"
    )


def check_reference_tokenizer(policy_tokenizer, reference_path: str | None, reference_tokenizer: str | None) -> None:
    """Raise ModelLoadError (one line) when the reference's tokenizer differs from the policy's.

    ``reference_path`` null: the reference is the initial policy, nothing to check.
    """
    if reference_path is None:
        return
    where = "reference.tokenizer" if reference_tokenizer else "reference.model_path"
    path = reference_tokenizer or reference_path
    check_model_source(reference_path, "reference.model_path")
    check_model_source(path, where)
    difference = vocabulary_difference(policy_tokenizer.get_vocab(), load_tokenizer(path).get_vocab())
    if difference is not None:
        raise ModelLoadError(
            f"{where}: the tokenizer of {path} maps tokens to other ids than the policy's ({difference}); the "
            "per-token KL needs the same token ids: use a reference of the policy's family or drop reference.model_path"
        )


def check_teacher_tokenizer(
    student_tokenizer, student: str, field: str, name: str, model_path: str | None, tokenizer: str | None
) -> None:
    """Raise ModelLoadError (one line naming both models) when a teacher's tokenizer maps any of the
    student's tokens (`student`: its model.path or model.tokenizer) to another id, or lacks one. A
    teacher's extra tokens are no problem: it only scores tokens the student sampled. `field`: the
    teacher's entry, "distillation.teachers.0". A url teacher (model_path None) is checked through
    the tokenizer its entry names, that of the model its server runs: its whole token -> id map
    here, offline, where asking the server (/tokenize) would check a sample of tokens, and only
    while the server is up."""
    where = f"{field}.tokenizer" if tokenizer else f"{field}.model_path"
    path = tokenizer or model_path
    if model_path is not None:
        check_model_source(model_path, f"{field}.model_path")
    check_model_source(path, where)
    student_vocab, teacher_vocab = student_tokenizer.get_vocab(), load_tokenizer(path).get_vocab()
    shared = {token: teacher_vocab[token] for token in student_vocab if token in teacher_vocab}
    difference = vocabulary_difference(student_vocab, shared, ("the student", "the teacher"))
    if difference is not None:
        raise ModelLoadError(
            f"{where} (teacher {name}): the tokenizer of {path} maps the tokens of the student {student} to other "
            f"ids ({difference}); a teacher must share the student's vocabulary (distillation compares both "
            "models' log-probs of the same token ids): use a teacher of the student's family"
        )
