"""gvq/schema/errors.py: a composition error as one line; here the options a Hydra plugin brings, when
the plugin is not installed (the one-line errors of the CLI as a whole: tests/run/test_errors.py)."""
from __future__ import annotations

from hydra.errors import MissingConfigException

from gvq.schema.errors import describe


def test_an_option_whose_plugin_is_missing_names_the_extra_that_installs_it():
    chosen = MissingConfigException("Could not find 'hydra/launcher/joblib'", "hydra/launcher/joblib",
                                    options=["basic", "slurm"])
    assert describe(chosen) == ("hydra/launcher=joblib: its Hydra plugin is not installed "
                                "(pip install -e '.[joblib]')")
    wrapped = MissingConfigException("In 'hydra/launcher/slurm': Could not load 'hydra/launcher/submitit_slurm'.",
                                     "hydra/launcher/submitit_slurm")      # conf/hydra/launcher/slurm.yaml's default
    assert describe(wrapped).endswith("(pip install -e '.[slurm]')")


def test_any_other_missing_option_lists_the_options():
    e = MissingConfigException("Could not find 'model/resnet3'", "model/resnet3", options=["cnn", "resnet32"])
    assert describe(e) == "model=resnet3: no such option; did you mean model=resnet32? options: cnn, resnet32"
