"""A reference model other than the policy must speak the policy's token ids.

The KL term compares the policy's and the reference's log-probs of the same token ids, token by
token. A reference whose tokenizer maps a token to another id (another model family, or the same
family with other added tokens) would score other tokens without any error: the KL would be
noise. So the run is refused at start, in one line, unless both tokenizers map every token to
the same id. The whole token -> id maps are compared, not their sizes: two vocabularies of the
same size can still differ. (Embedding sizes may differ: Qwen2.5 3B and 7B pad their embedding
matrices differently but share one tokenizer, which is what counts.)
"""

from __future__ import annotations

from grpo_ray.models.hub import check_model_source
from grpo_ray.models.loading import ModelLoadError, load_tokenizer


def vocabulary_difference(policy: dict[str, int], reference: dict[str, int]) -> str | None:
    """None when both token -> id maps are equal, else a short description of the first difference.

    >>> vocabulary_difference({"a": 0, "b": 1}, {"a": 0, "b": 1}) is None
    True
    >>> vocabulary_difference({"a": 0, "b": 1}, {"a": 1, "b": 0})
    "2 of 2 tokens differ, e.g. 'a' is 0 for the policy and 1 for the reference"
    >>> vocabulary_difference({"a": 0}, {"a": 0, "c": 1})
    "1 of 2 tokens differ, e.g. 'c' is absent for the policy and 1 for the reference"
    """
    if policy == reference:
        return None
    tokens = sorted(
        set(policy) | set(reference), key=lambda t: (min(policy.get(t, 1 << 62), reference.get(t, 1 << 62)), t)
    )
    differing = [t for t in tokens if policy.get(t) != reference.get(t)]
    first = differing[0]
    show = lambda vocab: "absent" if first not in vocab else str(vocab[first])  # noqa: E731
    return (
        f"{len(differing)} of {len(tokens)} tokens differ, e.g. {first!r} is {show(policy)} for the policy "
        f"and {show(reference)} for the reference"
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
