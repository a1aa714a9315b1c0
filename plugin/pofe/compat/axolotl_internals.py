"""axolotl's internals: its plugin loading, its CLI's recipe loader and options, its config logger and debug log."""

from __future__ import annotations

from importlib.metadata import version

from pofe.compat.registry import ENTRIES, Entry, entry


@entry(
    reaches="axolotl: the plugins load_cfg loads before checking `rl` (0.21: every installed one too)",
    names=(),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="POFE requires axolotl >= 0.21",
)
def loads_installed_plugins() -> bool:
    """Whether this axolotl loads installed plugins without a `plugins:` line (0.21 on)."""
    return tuple(int(n) for n in version("axolotl").split(".")[:2]) >= (0, 21)


ENTRIES["AXOLOTL_CONFIG_LOGGER"] = Entry(
    reaches="axolotl: the logger whose records dump the whole validated config (masking only axolotl's own "
    "secret keys)",
    names=("axolotl.cli.config",),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="axolotl masks a plugin's secret keys in its config dump itself",
)
AXOLOTL_CONFIG_LOGGER = "axolotl.cli.config"


ENTRIES["AXOLOTL_DEBUG_LOG"] = Entry(
    reaches="axolotl: the file in output_dir that prepare_debug_log (axolotl.utils.tee) tees a run's console into",
    names=("debug.log",),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="axolotl hands a plugin its log of the run (or POFE keeps tracebacks in a log of its own)",
)
AXOLOTL_DEBUG_LOG = "debug.log"


@entry(
    reaches="axolotl: axolotl.cli.config.load_cfg, the CLI's recipe loader (plugins registered, config validated "
    "and normalised, overrides applied)",
    names=("load_cfg",),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="axolotl exposes loading a recipe outside its CLI",
)
def load_axolotl_config(path: str, **overrides):
    """A recipe as `axolotl train PATH --key value ...` reads it: axolotl's validated config."""
    from axolotl.cli.config import load_cfg

    return load_cfg(path, **overrides)


@entry(
    reaches="axolotl: axolotl.cli.config_options.AXOLOTL_CONFIG_CLI_OPTIONS and axolotl.cli.utils "
    "(add_options_from_config_options, filter_none_kwargs), the options `axolotl train` takes",
    names=("AXOLOTL_CONFIG_CLI_OPTIONS", "add_options_from_config_options", "filter_none_kwargs"),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="axolotl exposes its config options for a plugin's commands",
)
def axolotl_overrides(command):
    """axolotl's config options on a command (`--num-epochs 3`, `--learning-rate 2e-5`, ...), as
    `axolotl train` takes them; they reach the command as keyword arguments (unset ones dropped)."""
    from axolotl.cli.config_options import AXOLOTL_CONFIG_CLI_OPTIONS
    from axolotl.cli.utils import add_options_from_config_options, filter_none_kwargs

    return add_options_from_config_options(AXOLOTL_CONFIG_CLI_OPTIONS)(filter_none_kwargs(command))
