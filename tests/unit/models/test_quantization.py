"""model.quantization: refused in one line before anything starts where bitsandbytes cannot run,
and accepted where it can (bitsandbytes >= 0.50 quantises on CPU; the learner's real update over
a quantised base is tests/integration/test_learner_and_sync.py::test_quantized_base_trains_only_the_adapter)."""

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_ray.cli import main
from grpo_ray.config import ConfigError, config_from_dict
from grpo_ray.models.quantization import quantization_problem

REPO = Path(__file__).resolve().parents[3]
TINY = str(REPO / "configs" / "tiny.yaml")
QLORA = ["--set", "model.quantization=4bit", "--set", "model.lora.enabled=true"]


def test_quantization_without_lora_is_refused():
    with pytest.raises(ConfigError, match=r"^model.quantization: 4bit trains a LoRA adapter"):
        config_from_dict({"model": {"quantization": "4bit"}})


def test_quantization_sends_the_adapter_only():
    with pytest.raises(ConfigError, match=r"^weight_sync.lora_adapter_only: "):
        config_from_dict(
            {"model": {"quantization": "8bit", "lora": {"enabled": True}}, "weight_sync": {"lora_adapter_only": False}}
        )


def test_unknown_kind_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"^model.quantization"):
        config_from_dict({"model": {"quantization": "2bit", "lora": {"enabled": True}}})


@pytest.mark.parametrize("kind", ["4bit", "8bit"])
def test_bitsandbytes_quantises_here(kind):
    pytest.importorskip("bitsandbytes")  # the optional [quant] extra
    assert quantization_problem(kind, learners_on_gpu=False) is None


def test_validate_accepts_qlora_where_bitsandbytes_runs():
    pytest.importorskip("bitsandbytes")
    result = CliRunner().invoke(main, ["validate", TINY, *QLORA, "--verbose"])  # --verbose: the resolved config
    assert result.exit_code == 0, result.output
    assert "quantization: 4bit" in result.output


def test_validate_refuses_qlora_in_one_line_without_bitsandbytes():
    # A fresh interpreter where `import bitsandbytes` fails, as on a machine without the extra
    # (sys.modules[name] = None is Python's own way to make an import fail).
    code = "import sys; sys.modules['bitsandbytes'] = None; from grpo_ray.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "validate", TINY, *QLORA], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert result.returncode == 1, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: model.quantization: 4bit needs bitsandbytes, which cannot be imported here")
    assert "grpo-ray[quant]" in line
    assert "# resolved config" not in result.stdout  # refused before anything else


def test_a_4bit_base_still_trains_after_it_scored_in_eval_mode():
    # The learner scores (eval mode, no gradients) and then trains. On a CPU with AVX512-BF16,
    # bitsandbytes repacked the 4bit weights for inference on the first and failed on the second
    # unless the layers keep their trainable layout (on other CPUs this passes either way).
    pytest.importorskip("bitsandbytes")
    import torch

    from grpo_ray.models.loading import apply_lora, load_causal_lm
    from grpo_ray.models.tiny import ensure_tiny_artifacts

    model = load_causal_lm(str(ensure_tiny_artifacts().model_dir), "float32", quantization="4bit")
    model = apply_lora(model, 4, 8.0, 0.0, ("q_proj", "v_proj"))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    model.eval()
    with torch.no_grad():
        scored = model(input_ids=ids).logits
    model.train()
    trained = model(input_ids=ids).logits
    trained.float().logsumexp(-1).sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(trained.detach(), scored, atol=1e-5, rtol=0)
    layers = [m for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    assert layers and not any(m.support_avx512bf16_for_cpu for m in layers)
