"""`axolotl pofe eval`: every iterate on held-out prompts, and each round's headline.

`evaluate` runs it: every model's answers (`answers`, sampled by `sampler`, one model in
memory at a time), then the judges (`judging`); `headline` and `best_of_k` are the two
comparisons with the candidates, `statistics` the win-rate matrix, its intervals and
length control, `records` what eval.json and samples.jsonl hold, `decision` which iterate
to use and whether `pofe.stop_when` ends a run, `peak_memory` each part's measured peak.
"""
