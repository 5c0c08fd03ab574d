"""gvq's Hydra sweeper: a plugin must live in the ``hydra_plugins`` namespace for Hydra to load it."""
