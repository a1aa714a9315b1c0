"""Iterated runs: `axolotl pofe run / eval / report`.

`rounds` runs T rounds of generate -> judge -> train (each stage its own process),
`evaluation` scores every iterate on held-out prompts, `report` writes what the run's
files say. Layout and state (`layout`), prompt splits (`prompts`), derived recipes
(`recipe`), stage processes (`stages`), the LoRA merge (`merge`) and the tournament maths
(`tournament`) are each their own module; see docs/iterated.md.
"""
