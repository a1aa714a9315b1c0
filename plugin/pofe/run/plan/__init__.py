"""`axolotl pofe plan`: each stage's models, memory per GPU and disk, before a run starts.

`planner` plans a recipe (`plan_recipe`: the disk's facts from `sources`, then the pure
`plan_run`), one function per stage in `candidates` (generate, judge), `training` (train,
merge) and `online` (an online run's one stage), over `estimate`'s arithmetic and
`model_size`'s parameter counts; `common` holds what the stages share, `render` prints the plan.
"""
