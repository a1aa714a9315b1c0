"""Iterated runs: one package per command, over the run folder they share.

    rounds/       axolotl pofe run      T rounds of generate -> judge -> train, each stage a process
    evaluation/   axolotl pofe eval     every iterate on held-out prompts, each round's headline
    report/       axolotl pofe report   report.md, report.json and plots from the run's files
    plan/         axolotl pofe plan     each stage's memory and disk, before a run starts

What they share: `folder` (where a run keeps its files, and `pofe-run.json`), `guards` (one
runner per output_dir, whose files are POFE's, what a restart re-checks), `prompts` (which
prompts each round trains on and which are held out), `recipe` (the user's recipe, loaded
and fingerprinted) and `provenance` (each stage's environment, a round's record).
"""
