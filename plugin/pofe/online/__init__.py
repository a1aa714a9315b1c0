"""Online RRHF, SPPO and Nash-MD (`pofe.online`): candidates resampled from the moving policy
inside one `axolotl train`.

    prompts.py   the training set of an online run: its prompts, and the collator that
                 passes a batch's prompts to the trainer
    refresh.py   one refresh: sample with the policy as it is, judge, score, write, and the
                 k-response rows the next steps train on (the candidate pipeline's own stages)
    sampling.py  what samples a refresh: the training model, or a vLLM server into which each
                 refresh loads the policy's LoRA adapter
    colocated.py vLLM in the training process (TRL's VLLMGeneration), asleep between refreshes
    models.py    the policy unwrapped for a refresh, and pi_0 for RRHF's KL penalty, SPPO's
                 anchor mixed toward pi_0 and Nash-MD
    mixture.py   Nash-MD's opponent: the mixture of the policy and pi_0, sampled token by token
    opponents.py a Nash-MD refresh: each policy sample judged against an opponent of the mixture
    monitor.py   every `monitor_every` refreshes: the policy's perplexity of held-out reference
                 responses and a few sampled completions with their judgements
    trainer.py   the trainer that refreshes every `refresh_every` optimizer steps

The loss, the optimizer and the schedule are the offline trainer's: only where a step's
batch comes from changes. Each refresh is written under `<output_dir>/online/` before it is
trained on, so a resumed run trains on what the killed one did.
"""

from pofe.online.prompts import PromptCollator, load_online_prompts
from pofe.online.trainer import online_trainer

__all__ = ["PromptCollator", "load_online_prompts", "online_trainer"]
