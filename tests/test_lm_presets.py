"""The language-model presets (conf/experiment/lm_*.yaml) compose what their comparisons need: the GPT on
Austen's bytes with AdamW, each preset's sweep, and the budget GradiVeQ's schedule is scaled to."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("exp", ["lm_compare", "lm_tta"])
def test_lm_presets_compose_the_gpt_on_austen(compose_cfg, exp):
    cfg = compose_cfg(f"experiment={exp}", return_hydra_config=True)
    first = (ROOT / "conf" / "experiment" / f"{exp}.yaml").read_text().splitlines()
    assert first[0] == "# @package _global_" and f"python cli.py -m experiment={exp}" in "\n".join(first[:10])
    assert cfg.model._target_ == "gvq.models.GPT" and cfg.dataset._target_.endswith("austen")
    assert cfg.optim._target_ == "gvq.run.optim.adamw" and cfg.model.context >= cfg.dataset.context
    assert cfg.hydra.sweep.dir == f"runs/multirun/{exp}" and "rar" in cfg.hydra.sweeper.params.aggregator
    # GradiVeQ reaches its compressed phase well inside the budget
    assert cfg.warmup + cfg.L_t < cfg.iterations / 2 and cfg.warmup + cfg.L_t + cfg.L_c >= cfg.iterations / 2


def test_lm_tta_is_lm_compares_budget_with_finer_evaluations(compose_cfg):
    base, tta = compose_cfg("experiment=lm_compare"), compose_cfg("experiment=lm_tta")
    assert (tta.iterations, tta.batch_size, tta.optim.lr) == (base.iterations, base.batch_size, base.optim.lr)
    assert tta.eval_every < base.eval_every and tta.iterations % tta.eval_every == 0
    params = compose_cfg("experiment=lm_tta", return_hydra_config=True).hydra.sweeper.params
    assert params.world_size == "4,8" and set(params.aggregator.split(",")) == {
        "rar", "fp16", "qsgd", "powersgd", "gradiveq"}
