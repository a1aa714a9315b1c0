"""`axolotl pofe ...`: POFE's stages on their own (registered as an axolotl CLI plugin)."""

from __future__ import annotations

import click


@click.group(help="POFE (RRHF / SPPO) tools.")
def pofe():
    pass


@pofe.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--stage",
    type=click.Choice(["generate", "judge", "all"]),
    default="all",
    show_default=True,
    help="Stop after this stage; a later run resumes from its shards.",
)
def candidates(config: str, stage: str):
    """Generate and judge candidates for CONFIG's pofe.prompts datasets.

    The same pipeline `axolotl preprocess` runs, without tokenising for training:
    for users who generate on one machine and judge or train on another.
    """
    from axolotl.cli.config import load_cfg
    from axolotl.utils.data.shared import load_dataset_with_config

    from .data.formats import RowFormat
    from .data.loader import build_candidates

    cfg = load_cfg(config)
    if not cfg.pofe or not cfg.pofe.method:
        raise click.UsageError(f"{config} sets no `rl: rrhf` / `rl: sppo`")
    entries = [(i, e) for i, e in enumerate(cfg.datasets or []) if e.type == "pofe.prompts"]
    if not entries:
        raise click.UsageError(f"{config} has no dataset of type pofe.prompts")
    for i, entry in entries:
        fields = cfg.pofe.dataset_fields[i] if i < len(cfg.pofe.dataset_fields or []) else {}
        fmt = RowFormat(dataset=entry.path, type=entry.type, method=cfg.pofe.method, fields=fields)
        prompts = load_dataset_with_config(entry, cfg.hf_use_auth_token)
        result = build_candidates(
            cfg, entry, prompts, fmt.column("field_prompt"),
            stop_after=None if stage == "all" else stage,
        )
        if result is not None:
            click.echo(f"{entry.path}: {result.rows} rows -> {result.data_path}")
