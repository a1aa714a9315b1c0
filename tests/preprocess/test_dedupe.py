from pofe.preprocess.dedupe import dedupe, normalise


def test_normalise():
    assert normalise("  Hello,   World!! ") == "hello world"


def test_dedupe_counts_exact_and_near():
    cands = ["The answer is 4.", "The answer is 4.", "the answer is 4", "The answer is 5", "THE  ANSWER, is 4"]
    kept, exact, near = dedupe(cands)
    assert kept == [0, 3]
    assert (exact, near) == (1, 2)
