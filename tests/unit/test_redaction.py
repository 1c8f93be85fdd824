"""Secrets never reach MLflow params: what the driver logs goes through redact_config."""

from grpo_ray.tracking import redact_config


def test_secret_keys_and_secret_environment_values_are_masked():
    config = {
        "reward": {
            "functions": [
                {
                    "name": "http",
                    "options": {
                        "url": "http://judge",
                        "api_key": "sk-123",
                        "headers": {"Authorization": "Bearer tok-9876"},
                    },
                }
            ]
        },
        "model": {"path": "Qwen/Qwen3-4B"},
        "tracking": {"run_name": "hf_abcdef"},
    }
    environ = {"HF_TOKEN": "hf_abcdef", "HOME": "/root", "OPENAI_API_KEY": "sk-123"}
    shown = redact_config(config, environ)
    options = shown["reward"]["functions"][0]["options"]
    assert options["api_key"] == "***"  # its key looks secret
    assert options["url"] == "http://judge" and shown["model"]["path"] == "Qwen/Qwen3-4B"
    assert shown["tracking"]["run_name"] == "***"  # equals the value of HF_TOKEN
    assert options["headers"] == {"Authorization": "Bearer tok-9876"}  # nothing says it is secret...
    assert redact_config({"headers": {"token": "x"}}, {})["headers"]["token"] == "***"  # ...but a key does
    assert config["reward"]["functions"][0]["options"]["api_key"] == "sk-123"  # the config itself is untouched
