"""benchmarks/demo_figures.py keeps other machines' figures (issue 49): the README's ranges held
an Intel Xeon's SPPO online figures beside the EPYC's CPU profiles, and `--write` on one machine
dropped the other's. benchmarks/demo-machines.json records them, per recipe's settings."""

from __future__ import annotations

import pytest

from benchmarks.demo_figures import recipe_settings, with_machines

EXACT = "greedy exact match, training prompts"


def test_another_machines_figures_widen_the_ranges_while_its_recipe_is_unchanged():
    """SPPO online's recipe is as the other machine ran it: its 0.933-0.950 joins this machine's
    0.967 (0.933-0.967). Nash-MD's recipe changed since (its settings' hash differs): that machine's
    0.717-0.783 is dropped, and this machine's 0.850 stands alone."""
    ranges = {f"{EXACT} | SPPO online": ["0.967", "0.967"], f"{EXACT} | NASH-MD online": ["0.850", "0.850"]}
    native = {
        "runs": [
            {"title": "SPPO online", "recipe": "/any/where/tiny-sppo-online-cpu.yml"},
            {"title": "NASH-MD online", "recipe": "/any/where/tiny-nash-md-online-cpu.yml"},
        ]
    }
    machines = {
        "Other CPU, 2 cores": {
            "SPPO online": {
                "settings": recipe_settings("tiny-sppo-online-cpu.yml"),
                "figures": {EXACT: ["0.933", "0.950"]},
            },
            "NASH-MD online": {"settings": "an older recipe", "figures": {EXACT: ["0.717", "0.783"]}},
        }
    }
    merged, used = with_machines(ranges, native, machines)
    assert merged == {f"{EXACT} | SPPO online": ["0.933", "0.967"], f"{EXACT} | NASH-MD online": ["0.850", "0.850"]}
    assert used == ["Other CPU, 2 cores"]


def test_a_recorded_figure_the_table_no_longer_has_is_an_error():
    """A row renamed in the demo's table leaves the record's figure unmatched: named, not dropped."""
    native = {"runs": [{"title": "SFT", "recipe": "tiny-sft-cpu.yml"}]}
    machines = {
        "Other": {"SFT": {"settings": recipe_settings("tiny-sft-cpu.yml"), "figures": {"exact match": ["0.3", "0.4"]}}}
    }
    with pytest.raises(
        SystemExit, match="demo-machines.json: Other's figure 'exact match | SFT' is not in the demo's table"
    ):
        with_machines({f"{EXACT} | SFT": ["0.367", "0.367"]}, native, machines)
