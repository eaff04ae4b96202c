"""The run's prompts as the store and the validator get them, encoded once per row.

A text row is encoded with the model's chat template; a row with images by the model's
processor (``algo/multimodal.encode_image_prompt``): vLLM is sent the ids with one
placeholder per image plus the images (it expands the placeholders itself), the trainer the
ids with each placeholder expanded to the image's tokens plus the images' bytes (it runs
the image processor itself).  ``PromptStream`` turns the prompt cursor into the store's
groups; ``val_set`` builds the validation prompts as the replica gets them.
"""

from __future__ import annotations

from pathlib import Path

from bidirl.algo.data import PromptCursor
from bidirl.algo.multimodal import encode_image_prompt
from bidirl.models.tiny import encode_prompt, load_tokenizer
from bidirl.runtime.config import TrainConfig
from bidirl.runtime.group_store import GroupStore
from bidirl.runtime.prepare import PromptLengths
from bidirl.runtime.trajectories import verl_row
from bidirl.runtime.validation import ValSet


def val_set(cfg: TrainConfig, fit: PromptLengths, tok) -> ValSet | None:
    """The kept validation prompts (``fit.val_rows``) as the replica gets them; None when
    there are none."""
    if not fit.val_rows:
        return None
    kept = list(fit.val_rows)
    encoded = [encode_row(tok, r) for r in kept]
    images = [imgs for _, imgs, _ in encoded] if fit.max_images else None
    return ValSet(kept, [ids for ids, _, _ in encoded], cfg.rollout.max_new_tokens, cfg.rollout.val_temperature,
                  cfg.run.seed, images)


def load_prompt_encoder(model_dir: str | Path, rows):
    """What encodes the run's prompts: the model's processor when a row holds images (its chat
    template and image tokens), else its tokenizer."""
    if any(getattr(r, "images", ()) for r in rows):
        from transformers import AutoProcessor  # lazy: transformers loads while Ray starts (session.run)

        return AutoProcessor.from_pretrained(str(model_dir))
    return load_tokenizer(model_dir)


def encode_row(tok, row) -> tuple[list[int], tuple[bytes, ...], list[int] | None]:
    """(the ids vLLM is sent, the row's images, the trainer's ids or None when they are the same):
    a row with images through the model's processor (``algo/multimodal.encode_image_prompt``:
    one placeholder per image for vLLM, each expanded for the trainer); a text row through
    the chat template."""
    if getattr(row, "images", ()):
        prompt = encode_image_prompt(tok, row)
        return prompt.rollout_ids, row.images, prompt.input_ids
    return encode_prompt(getattr(tok, "tokenizer", tok), row.messages), (), None


class PromptStream:
    """The run's prompts, group by group: each new group takes the cursor's next row, whose
    prompt is encoded once (the chat template applied; images through the processor) and
    kept for the row's next turn."""

    def __init__(self, cursor: PromptCursor, store: GroupStore, tok, keep_rows: bool = False) -> None:
        """``keep_rows``: each group keeps its data row (multi-turn: its environments are reset with it)."""
        self.cursor, self.store, self.tok, self.keep_rows = cursor, store, tok, keep_rows
        self.text_tok = getattr(tok, "tokenizer", tok)  # a processor's tokenizer decodes
        self._prompts: dict[int, tuple[list[int], tuple[bytes, ...], list[int] | None]] = {}

    def new_group(self, gid: int) -> None:
        """Create group ``gid`` (a global id) in the store."""
        item = self.cursor.next()
        key = item.index
        if key not in self._prompts:
            self._prompts[key] = encode_row(self.tok, item.row)
        ids, images, train_ids = self._prompts[key]
        self.store.add(gid, item.uid, ids, item.row.data_source, item.row.ground_truth, item.row.extra_info,
                       images, train_ids, row=verl_row(item.row) if self.keep_rows else None)

    def decode(self, ids) -> str:
        """A response's text, as the reward function reads it."""
        return self.text_tok.decode(ids, skip_special_tokens=True)

    def decode_prompt(self, ids) -> str:
        """A prompt's text, its template included (for samples)."""
        return self.text_tok.decode(ids, skip_special_tokens=False)
