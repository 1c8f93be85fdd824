"""Distinct-n diversity: hand-counted n-grams."""

import numpy as np
import pytest

from grpo_ray.algo.diversity import distinct_ngram_ratio, group_diversity, ngram_counts


def test_distinct_4grams_hand_counted():
    texts = ["a b c d e", "a b c d f"]
    # 4-grams: (a b c d) (b c d e) | (a b c d) (b c d f): 4 in all, 3 distinct
    assert ngram_counts(texts, 4) == (3, 4)
    assert distinct_ngram_ratio(texts) == 0.75
    # unigrams: 10 words, distinct {a b c d e f} = 6
    assert distinct_ngram_ratio(texts, n=1) == 0.6


def test_identical_texts_and_repeats_within_a_text():
    assert distinct_ngram_ratio(["x y z w"] * 3) == pytest.approx(1 / 3)  # one 4-gram, seen 3 times
    assert distinct_ngram_ratio(["a a a a a"], n=2) == 0.25  # 4 bigrams, all (a a)
    assert distinct_ngram_ratio(["a  b\nc   d"]) == 1.0  # any whitespace separates words


def test_no_ngram_gives_zero():
    assert distinct_ngram_ratio(["hi", ""], n=4) == 0.0
    assert distinct_ngram_ratio([], n=4) == 0.0
    with pytest.raises(ValueError):
        distinct_ngram_ratio(["a"], n=0)


def test_tokenizers():
    # a callable: characters; "abab" bigrams ab, ba, ab -> 2 distinct of 3
    assert distinct_ngram_ratio(["abab"], n=2, tokenizer=list) == pytest.approx(2 / 3)

    class Ids:  # stands in for a Hugging Face tokenizer: only .encode is used
        def encode(self, text):
            return [len(word) for word in text.split()]

    # "aa b cc d" -> [2, 1, 2, 1]: bigrams (2,1) (1,2) (2,1) -> 2 of 3
    assert distinct_ngram_ratio(["aa b cc d"], n=2, tokenizer=Ids()) == pytest.approx(2 / 3)
    with pytest.raises(TypeError):
        distinct_ngram_ratio(["a b"], n=1, tokenizer=3)


def test_group_diversity_means_groups_with_ngrams():
    texts = ["a b c d e", "x y z w", "a b c d f", "x y z w", "short"]
    group_ids = np.array([0, 1, 0, 1, 2])
    # group 0: .75 (above); group 1: one 4-gram twice -> .5; group 2: no 4-gram, left out
    assert group_diversity(texts, group_ids) == pytest.approx((0.75 + 0.5) / 2)
    assert group_diversity(["a", "b"], [0, 1]) == 0.0
    with pytest.raises(ValueError):
        group_diversity(["a"], [0, 1])
