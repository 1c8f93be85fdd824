"""prepare_inputs on a small POLARIS-format file: instruction, difficulty band, validation split."""

import json

import pytest

from grpo_ray.config import config_from_dict
from grpo_ray.data.formats import POLARIS_INSTRUCTION
from grpo_ray.data.loaders import DataError
from grpo_ray.training.inputs import prepare_inputs


@pytest.fixture()
def polaris_file(tmp_path):
    path = tmp_path / "polaris.jsonl"
    rows = [{"problem": f"{i}+{i}=", "answer": str(2 * i), "difficulty": f"{i % 9}/8"} for i in range(40)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def cfg_for(path, **data):
    return config_from_dict(
        {
            "model": {"path": "tiny"},
            "data": {"train_files": [str(path)], "eval_files": [], "max_prompt_tokens": 64, **data},
        }
    )


def test_instruction_band_and_validation_split(polaris_file):
    inputs = prepare_inputs(cfg_for(polaris_file, instruction="so:", difficulty_band=[0.25, 0.75], val_fraction=0.25))
    # Difficulties i % 9 / 8 in [0.25, 0.75] are k = 2..6: 5 of every 9 values of i; 40 rows -> 22 kept.
    assert inputs.dropped_by_difficulty == 18
    assert len(inputs.eval_prompts) == round(22 * 0.25) and len(inputs.train_prompts) == 22 - round(22 * 0.25)
    assert all(p.text.endswith("\n\nso:") for p in inputs.train_prompts + inputs.eval_prompts)
    assert all(p.fields["difficulty_frac"] is not None for p in inputs.train_prompts)


def test_polaris_instruction_constant_and_empty_band_error(polaris_file):
    inputs = prepare_inputs(cfg_for(polaris_file, instruction=POLARIS_INSTRUCTION, max_prompt_tokens=512))
    assert inputs.train_prompts[0].text.endswith(POLARIS_INSTRUCTION) and inputs.eval_prompts == []
    with pytest.raises(DataError, match=r"^data\.difficulty_band: \[0\.9, 0\.95\] removed all 40 rows"):
        prepare_inputs(cfg_for(polaris_file, difficulty_band=[0.9, 0.95]))


def test_prompt_uid_is_the_record_index_across_files_and_survives_filters(polaris_file, tmp_path):
    # A second file with an unusable record first: indices count it, and run on from the first file.
    second = tmp_path / "more.jsonl"
    second.write_text(
        json.dumps({"problem": "", "answer": "1"})
        + "\n"
        + json.dumps({"problem": "9+9=", "answer": "18", "difficulty": "4/8"})
    )
    cfg = config_from_dict(
        {
            "model": {"path": "tiny"},
            "data": {
                "train_files": [str(polaris_file), str(second)],
                "eval_files": [],
                "max_prompt_tokens": 64,
                "difficulty_band": [0.25, 0.75],
            },
        }
    )
    inputs = prepare_inputs(cfg)
    by_uid = {p.uid: p for p in inputs.train_prompts}
    assert by_uid[2].text == "2+2=" and by_uid[6].text == "6+6=" and 0 not in by_uid  # 0/8 is out of the band
    assert by_uid[41].text == "9+9="  # 40 records in the first file, then the unusable one (40)
