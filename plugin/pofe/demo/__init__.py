"""The embedded toy world: a tiny offline Llama, a verifiable addition task, greedy evaluation.

- `pofe.demo.tiny.build_tiny_model(path)` writes a random-init model and tokenizer that load
  by path like a hub model.
- `pofe.demo.task` scores answers to prompts such as "12+7=" and writes RRHF / SPPO rows.
- `pofe.demo.evaluate.greedy_reward(model_dir, prompts)` measures a model (or LoRA adapter).
- `python -m pofe.demo` (`make demo`: `--all`) runs recipes on it, each stage as `axolotl pofe
  run` runs its own (`pofe.demo.stages`), and prints one result table (`pofe.demo.tables`).

Submodules are not imported here, so `import pofe.demo.task` stays free of torch start-up.
"""
