"""docs/distillation.md's recipe blocks are recipes the schema takes as written (the page cannot
drift from the fields it documents)."""

import re
from pathlib import Path

import pytest
import yaml

from grpo_ray.config import config_from_dict

PAGE = Path(__file__).resolve().parents[3] / "docs" / "distillation.md"
BLOCKS = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)


def test_the_page_shows_recipes():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block-{i}" for i in range(len(BLOCKS))])
def test_each_recipe_block_is_a_valid_distillation_section(block):
    cfg = config_from_dict(yaml.safe_load(block))
    assert cfg.use_distillation and all(t.name for t in cfg.distillation.teachers)
