import pytest

from pofe_candidates.dedupe import dedupe, normalise


def test_normalise():
    assert normalise("  Hello,   World!! ") == "hello, world!!"
    assert normalise("The\tanswer is\n4. ") == "the answer is 4"
    assert normalise("ＦＯＵＲ。") == "four"  # NFKC: full-width letters; the ideographic full stop


@pytest.mark.parametrize(
    "a, b",
    [
        ("19", "-19"),
        ("x = 3", "x = -3"),
        ("2+2=4", "2*2=4"),
        ("$5", "5%"),
        ("5!", "5"),
    ],
)
def test_signs_operators_digits_and_units_stay_apart(a, b):
    assert normalise(a) != normalise(b)
    assert dedupe([a, b]) == ([0, 1], 0, 0)


def test_dedupe_counts_exact_and_near():
    """Exact: [1] = [0]. Near: [2] (case, final stop), [4] (case, spacing). [3] differs in a
    digit; [5] differs by a comma, kept."""
    cands = [
        "The answer is 4.",
        "The answer is 4.",
        "the answer is 4",
        "The answer is 5",
        "THE  ANSWER is 4",
        "The answer, is 4",
    ]
    kept, exact, near = dedupe(cands)
    assert kept == [0, 3, 5]
    assert (exact, near) == (1, 2)
