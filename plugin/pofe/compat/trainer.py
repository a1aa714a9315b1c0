"""The Trainer internals POFE's trainers override (transformers' and axolotl's)."""

from __future__ import annotations

from pofe.compat.registry import ENTRIES, Entry, entry


class TrainerHooks:
    """Mixed in first in POFE's trainers (before axolotl's `AxolotlTrainer`): the Trainer
    internals they override, each answered by a POFE-named method the trainer defines."""

    def batch_columns(self) -> list[str]:  # the dataset columns the collator needs (not forward() arguments)
        raise NotImplementedError

    def keeps_configured_state(self) -> bool:  # whether to keep the state `remake_state_on_cpu` made
        return False

    @entry(
        reaches="transformers: Trainer.model_accepts_loss_kwargs, which makes the Trainer pass token counts to "
        "the loss instead of dividing by the accumulation steps",
        names=("model_accepts_loss_kwargs",),
        written_for="transformers 5.16.1, 5.20.1",
        goes_when="the Trainer reads this from compute_loss's signature (POFE's losses take no num_items_in_batch)",
    )
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # POFE's losses are means over prompts: the Trainer divides by the accumulation steps itself
        self.model_accepts_loss_kwargs = False

    @entry(
        reaches="transformers: Trainer._set_signature_columns_if_needed and _signature_columns (the columns "
        "remove_unused_columns keeps)",
        names=("_set_signature_columns_if_needed", "_signature_columns"),
        written_for="transformers 5.16.1, 5.20.1",
        goes_when="the Trainer takes the columns to keep as an argument",
    )
    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(self.batch_columns())

    @entry(
        reaches="transformers: Trainer.create_accelerator_and_postprocess, and TrainingArguments dropping "
        "accelerator_config.use_configured_state once it took accelerate's state (axolotl's override would reset it)",
        names=("create_accelerator_and_postprocess",),
        written_for="transformers 5.16.1, 5.20.1; accelerate 1.13.0, 1.15.0",
        goes_when="remake_state_on_cpu goes (a state accelerate makes itself needs no keeping)",
    )
    def create_accelerator_and_postprocess(self):
        if self.keeps_configured_state():
            self.args.accelerator_config.use_configured_state = True
        super().create_accelerator_and_postprocess()

    # axolotl >= 0.21 reads this: exp(loss) is a token perplexity only for cross-entropy
    reports_token_perplexity = False


ENTRIES["TrainerHooks.reports_token_perplexity"] = Entry(
    reaches="axolotl: AxolotlTrainer.reports_token_perplexity, whether its log adds ppl / eval_ppl",
    names=("reports_token_perplexity",),
    written_for="axolotl 0.21.0",
    goes_when="axolotl logs a perplexity only for its own cross-entropy trainers",
)


@entry(
    reaches="axolotl: AxolotlTrainer.log adds ppl and eval_ppl (exp of the loss) to every log, with no switch",
    names=(),
    written_for="axolotl 0.19.0 (0.21.0 reads reports_token_perplexity instead)",
    goes_when="POFE requires axolotl >= 0.21",
)
def without_token_perplexity(trainer_class: type) -> type:
    """A subclass of `trainer_class` (transformers' `Trainer`) whose `log` drops them: after
    `AxolotlTrainer` in a trainer's bases, it sees the logs just before transformers records them."""

    class WithoutTokenPerplexity(trainer_class):
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            logs.pop("ppl", None)
            logs.pop("eval_ppl", None)
            super().log(logs, start_time)

    return WithoutTokenPerplexity


class StepBatches:
    """Mixed in first by a trainer that makes each optimizer step's micro-batches itself."""

    def step_batches(self, epoch_iterator, num_batches: int) -> list[dict]:  # the next step's micro-batches
        raise NotImplementedError

    @entry(
        reaches="transformers: Trainer.get_batch_samples(epoch_iterator, num_batches, device) -> (batches, "
        "num_items_in_batch), which the training loop calls once per optimizer step",
        names=("get_batch_samples",),
        written_for="transformers 5.16.1, 5.20.1",
        goes_when="the Trainer takes a per-step batch source publicly (as TRL's trainers would need one too)",
    )
    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        return self.step_batches(epoch_iterator, num_batches), None  # means over prompts: no token count
