"""The typed config both entry points compose through: ``cli.py`` (gvq/run/) and a user's own script
(gvq/hooks/).  Pure: Hydra and OmegaConf, no torch, nothing of gvq's above it.

    config.py   the top level's typed keys and the knobs option files interpolate; register() stores
                every schema in Hydra's ConfigStore
    options.py  one dataclass schema per constructor an option file builds (a misspelt key is refused)
    errors.py   a composition error as one line, with the closest match (ConfigError)
    compose.py  where conf/ is (a checkout's, or the wheel's copy), and compose(overrides) as the CLI does
    tool.py     the tools' command line (bench, predict, report, analysis): key=value overrides, --cfg
"""
