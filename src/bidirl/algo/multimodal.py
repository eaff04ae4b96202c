"""Image rows: veRL's multimodal dataset layout, checked at load time, and their model inputs.

Row layout (veRL's, ``data.image_key`` naming the images column, ``images`` by default)::

    prompt:        chat messages whose text holds one "<image>" per image, in order
    images:        a list; each image {"bytes": <encoded PNG/JPEG/...>} (what Hugging Face
                   datasets writes to parquet: {"bytes": ..., "path": ...}), {"path": str},
                   {"image": path or "file://path"} (veRL / qwen-vl-utils), or a plain path
    data_source, reward_model.ground_truth, extra_info: as a text row (``algo/data.py``)

In JSON lines an image's ``bytes`` may be a base64 string (JSON has no bytes).  A relative
path is read relative to the data file's directory.  A file none of whose records has the
images column is a text file: its rows are ``data.validate_row``'s, unchanged.

Why check every image at load time (as ``data.py`` checks every text row): an image that
cannot be decoded, a prompt whose ``<image>`` count differs from its images, or an image
over the pixel budget would otherwise stop a run inside a rollout worker, steps in.  Each
is one :class:`~bidirl.algo.data.DataError` line naming the file, the row and the image;
an image over ``max_pixels`` may instead drop its row, counted (``drop_oversized``), as
``data.filter_overlong_prompts`` drops over-long prompts.  The size is read from the
image's header before it is decoded, so a decompression bomb is never decoded.

The model's own processor and chat template build a row's input
(:func:`encode_image_prompt`): the content split at each ``<image>`` into veRL's parts
(``{"type": "image"}`` / ``{"type": "text"}``), rendered by the chat template, tokenized
with each image's placeholder expanded to the image's tokens, and the pixel inputs.  The
rollout's ids are the unexpanded ones (one placeholder token per image): vLLM expands
them itself, and does not recognise ids the processor has expanded already (it expands
the first placeholder again).  :func:`image_prompt_lengths` counts the expanded tokens,
which ``data.max_prompt_length`` limits.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bidirl.algo.data import DataError, PromptRow, read_records, row_label, validate_row

IMAGE_PLACEHOLDER = "<image>"
DEFAULT_MAX_IMAGE_PIXELS = 16384 * 28 * 28
"""12,845,056: the most pixels Qwen2.5-VL's and Qwen3-VL's processors take (``max_pixels``,
16,384 patches of 28 x 28) before they resize an image down."""
_CHECKED_ROWS = 8


@dataclass(frozen=True)
class ImagePromptRow(PromptRow):
    """A prompt row with images: their encoded bytes as the file gave them (decoded when used)."""

    images: tuple[bytes, ...] = ()
    sizes: tuple[tuple[int, int], ...] = ()
    """Each image's (width, height)."""


@dataclass(frozen=True)
class LoadedRows:
    """A data file's rows, and how many were dropped for an image over the pixel budget."""

    rows: list[PromptRow]
    oversized: int = 0


@dataclass(frozen=True)
class ImagePrompt:
    """One row's model input, as its processor builds it."""

    input_ids: list[int]
    """The prompt the trainer sees: each image placeholder expanded to the image's tokens."""
    rollout_ids: list[int]
    """The prompt vLLM gets with the images: one placeholder token per image."""
    pixel_inputs: dict[str, Any]
    """The processor's image outputs (``pixel_values`` and, per model, masks or grid sizes)."""


class OversizedImage(DataError):
    """An image over the pixel budget: an error, or its row dropped, as the caller chose."""


class _Oversized(Exception):
    """What :func:`check_image` found too large (the row's name is added by the caller)."""


def _fail(path: Path, row: int, fieldname: str, problem: str, allowed: str) -> DataError:
    return DataError(f"{path}: {row_label(path, row)}: field '{fieldname}' {problem}; allowed: {allowed}")


_IMAGE_FORMS = ("{'bytes': encoded image} (base64 text in JSON lines), {'path': str}, {'image': path}, "
                "or a path string")


def _image_bytes(raw: Any, base: Path) -> bytes:
    """The encoded bytes of one image as a row gives it; ``ValueError(problem)`` if it cannot."""
    if isinstance(raw, dict):
        data = raw.get("bytes")
        if data is not None:
            if isinstance(data, str):
                try:
                    return base64.b64decode(data, validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError("'bytes' is text that is not base64") from None
            if isinstance(data, bytes | bytearray | memoryview):
                return bytes(data)
            raise ValueError(f"'bytes' is {type(data).__name__}")
        raw = raw.get("path") or raw.get("image")
        if raw is None:
            raise ValueError("has neither 'bytes' nor 'path' nor 'image'")
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"is {type(raw).__name__} {raw!r:.60}")
    file = Path(raw.removeprefix("file://"))
    file = file if file.is_absolute() else base / file
    try:
        return file.read_bytes()
    except OSError as e:
        raise ValueError(f"names {str(file)!r}, which cannot be read ({e.strerror or e})") from None


def check_image(data: bytes, max_pixels: int) -> tuple[int, int]:
    """(width, height) of an encoded image that decodes whole and is within ``max_pixels``.

    ``ValueError(problem)`` if it cannot be decoded; :class:`_Oversized` if it is too large,
    found from the header before anything is decoded."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise _Oversized(f"is larger than PIL decodes safely (over {Image.MAX_IMAGE_PIXELS:,} pixels)") from e
        except Exception as e:  # PIL raises several types for what it cannot identify
            raise ValueError(f"cannot be decoded ({type(e).__name__}: {e})") from None
        width, height = img.size
        if width * height > max_pixels:
            raise _Oversized(f"is {width}x{height} = {width * height:,} pixels")
        try:
            img.load()
        except Exception as e:  # a truncated or corrupt stream fails only when decoded
            raise ValueError(f"cannot be decoded ({type(e).__name__}: {e})") from None
    return width, height


def placeholder_count(messages) -> int:
    """``<image>`` placeholders in a prompt's text."""
    return sum(str(m["content"]).count(IMAGE_PLACEHOLDER) for m in messages)


def validate_image_row(raw: Any, path: Path | str, row: int, image_key: str = "images",
                       max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> PromptRow:
    """One record of a file with an images column: a :class:`ImagePromptRow` (a plain
    :class:`PromptRow` when it holds no image and no placeholder).  Raises ``DataError``;
    :class:`OversizedImage`, one, for an image over ``max_pixels``."""
    path = Path(path)
    text_row = validate_row(raw, path, row)
    listed = raw.get(image_key)
    if isinstance(listed, np.ndarray):  # pandas hands list columns over as object arrays
        listed = listed.tolist()
    if listed is None:
        listed = []
    if not isinstance(listed, list | tuple):
        raise _fail(path, row, image_key, f"is {type(listed).__name__}", f"a list of images, each {_IMAGE_FORMS}")
    placeholders = placeholder_count(text_row.messages)
    if placeholders != len(listed):
        raise _fail(path, row, image_key, f"holds {len(listed)} image(s) but the prompt has {placeholders} "
                    f"{IMAGE_PLACEHOLDER} placeholder(s)", f"one {IMAGE_PLACEHOLDER} in the prompt's text per image, "
                    "in the images' order")
    if not listed:
        return text_row
    images, sizes = [], []
    for i, item in enumerate(listed):
        try:
            data = _image_bytes(item, path.parent)
            sizes.append(check_image(data, max_pixels))
        except ValueError as e:
            raise _fail(path, row, f"{image_key}[{i}]", str(e),
                        f"an image PIL decodes, given as {_IMAGE_FORMS}") from None
        except _Oversized as e:
            raise OversizedImage(
                f"{path}: {row_label(path, row)}: field '{image_key}[{i}]' {e}, over data.max_image_pixels="
                f"{max_pixels:,}; allowed: at most that many pixels (raise data.max_image_pixels, or set "
                "data.filter_oversized_images=true to drop such rows)") from None
        images.append(data)
    return ImagePromptRow(text_row.messages, text_row.data_source, text_row.ground_truth, text_row.extra_info,
                          row, str(path), tuple(images), tuple(sizes))


def load_prompt_rows(path: str | Path, image_key: str = "images", max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
                     drop_oversized: bool = False) -> LoadedRows:
    """Every row of a data file, images checked: a text file's rows as ``data.load_dataset``'s,
    an image file's as :class:`ImagePromptRow`; rows with an image over ``max_pixels`` dropped
    and counted with ``drop_oversized``, else the first is a ``DataError``."""
    path = Path(path)
    records = read_records(path)
    if not any(isinstance(r, dict) and image_key in r for r in records):
        return LoadedRows([validate_row(r, path, i) for i, r in enumerate(records)])
    rows, oversized = [], 0
    for i, rec in enumerate(records):
        try:
            rows.append(validate_image_row(rec, path, i, image_key, max_pixels))
        except OversizedImage:
            if not drop_oversized:
                raise
            oversized += 1
    if not rows:
        raise DataError(f"{path}: all {len(records)} rows hold an image over data.max_image_pixels={max_pixels:,} "
                        "pixels; nothing left to train on")
    return LoadedRows(rows, oversized)


# -- model inputs ---------------------------------------------------------------------------
def content_parts(messages) -> list[dict]:
    """The messages with each content split at its ``<image>`` placeholders into veRL's parts
    (``{"type": "image"}``, ``{"type": "text", "text": ...}``), as chat templates of
    vision-language models take them."""
    out = []
    for m in messages:
        parts = [{"type": "image"} if seg == IMAGE_PLACEHOLDER else {"type": "text", "text": seg}
                 for seg in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", str(m["content"])) if seg]
        out.append({"role": m["role"], "content": parts})
    return out


def decode_images(row: PromptRow) -> list[Image.Image]:
    """A row's images as RGB PIL images (none for a text row)."""
    return [Image.open(io.BytesIO(b)).convert("RGB") for b in getattr(row, "images", ())]


def render_prompt(processor, row: PromptRow) -> str:
    """The prompt's text as the model's chat template renders it, one placeholder per image."""
    return processor.apply_chat_template(content_parts(row.messages), add_generation_prompt=True, tokenize=False)


def encode_image_prompt(processor, row: PromptRow) -> ImagePrompt:
    """The row's input built by the model's processor: expanded ids and pixel inputs for the
    trainer, unexpanded ids for vLLM (which expands them with the same images)."""
    text = render_prompt(processor, row)
    images = decode_images(row)
    rollout_ids = list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    if not images:
        return ImagePrompt(rollout_ids, rollout_ids, {})
    enc = processor(text=[text], images=[images], add_special_tokens=False)
    pixels = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}
    return ImagePrompt(list(enc["input_ids"][0]), rollout_ids, pixels)


def image_prompt_lengths(processor, rows) -> list[int]:
    """Tokens of every row's prompt as the trainer sees it: each image placeholder counted as
    the tokens it expands to (what ``data.max_prompt_length`` limits).

    From the images' sizes, without processing pixels (the processor's own
    ``_get_num_multimodal_tokens``, which vLLM uses too); the first rows are checked against
    the processor's full output and, should they disagree, every row is processed whole."""
    def fast(row) -> int:
        ids = processor.tokenizer(render_prompt(processor, row), add_special_tokens=False)["input_ids"]
        sizes = [(h, w) for w, h in getattr(row, "sizes", ())]
        if not sizes:
            return len(ids)
        per_image = processor._get_num_multimodal_tokens(image_sizes=sizes).num_image_tokens
        return len(ids) + sum(n - 1 for n in per_image)

    def whole(row) -> int:
        return len(encode_image_prompt(processor, row).input_ids)

    try:
        lengths = [fast(r) for r in rows]
        same = all(lengths[i] == whole(r) for i, r in enumerate(rows[:_CHECKED_ROWS]))
    except (AttributeError, NotImplementedError, TypeError):  # a processor without the count
        same = False
    return lengths if same else [whole(r) for r in rows]
