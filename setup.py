"""What pyproject.toml cannot say: conf/ (Hydra's option files, at the repository's top level for
``cli.py``'s ``config_path``) ships inside the package as ``gvq/conf/``, so an installed gvq composes the
same options (``gvq.schema.compose.conf_dir`` finds either).  Everything else is in pyproject.toml."""
from setuptools import find_namespace_packages, find_packages, setup

CONF = ["gvq.conf", *(f"gvq.conf.{group}" for group in find_namespace_packages("conf"))]   # aggregator, ...

PLUGINS = ["hydra_plugins.gvq_sweeper"]    # Hydra loads plugins from the hydra_plugins namespace only

setup(packages=[*find_packages(include=["gvq*"]), *CONF, *PLUGINS], package_dir={"gvq.conf": "conf"},
      package_data={package: ["*.yaml"] for package in CONF})
