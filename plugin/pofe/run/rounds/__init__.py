"""`axolotl pofe run`: the round loop.

For t = 1..T: generate and judge candidates from pi_{t-1} and tokenise them (`axolotl
preprocess`), train pi_t (`axolotl train`), merge a LoRA adapter, publish; then evaluate and
report. `loop` drives the rounds, `runner` records each named stage in `pofe-run.json`,
`processes` runs a stage as a child process that ends with the runner, `round_recipe`
derives each round's recipe, `checkpoints` says which checkpoint a round may resume from,
and `publish` names and pushes each round's hub repos and tracker runs.
"""
