"""The reference for the rollout engine: HF transformers scoring given tokens, no generation.

Why: vLLM's behaviour log-probs (and its greedy choices) are checked against the plain HF
model on the same weights. One teacher-forced forward pass gives both: the untempered
``log_softmax`` of every response token (vLLM's ``raw_logprobs``, what the trainer
recomputes) and the argmax at every position (greedy decoding of ``prompt + response[:i]``
picks ``argmax[i]``, so a greedy response is correct iff it equals its argmaxes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def load_reference(model_dir, weights: dict[str, np.ndarray] | None = None):
    """The HF causal LM in eval mode (float32), optionally with checkpoint-named weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    if weights is not None:
        state = {k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()}
        unexpected = model.load_state_dict(state, strict=False).unexpected_keys
        if unexpected:
            raise KeyError(f"unknown parameter names: {sorted(unexpected)[:5]}")
    return model


@torch.no_grad()
def score_tokens(model, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> tuple[np.ndarray, list[int]]:
    """Per-token log-probs of ``token_ids`` after ``prompt_ids``, and the argmax at each position."""
    ids = torch.tensor([list(prompt_ids) + list(token_ids)])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(1, torch.tensor(list(token_ids)).view(-1, 1)).view(-1)
    return picked.numpy(), logits.argmax(dim=-1).tolist()
