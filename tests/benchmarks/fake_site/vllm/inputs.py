"""Fake ``vllm.inputs``: prompts as the dicts vLLM's TypedDicts are."""


def TokensPrompt(prompt_token_ids):  # noqa: N802 (vLLM's name)
    return {"prompt_token_ids": prompt_token_ids}
