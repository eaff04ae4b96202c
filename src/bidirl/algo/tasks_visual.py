"""A built-in visual task whose answer is only in the picture: shapes drawn with PIL.

Why: a vision-language run needs an RL signal without downloading a model or a data set, as
the text tasks give one (``algo/tasks.py``).  Each row is a 64 x 64 PNG (the tiny Idefics3
model's tile, ``models/tiny_vl.py``: no resizing) of 1-9 shapes (circles, squares,
triangles in six colours, one per cell of a 3 x 3 grid) and one of two questions whose text
never changes, so the text alone tells nothing:

- ``How many circles? Answer in \\boxed{}.``: 1-6 circles (uniform) among up to 3 other shapes;
- ``What colour is the largest shape? Answer in \\boxed{}.``: 2-5 shapes, the others at most
  2/3 as wide as the largest (so it has the most area too), its colour uniform over the six.

Rows are in veRL's multimodal layout (``algo/multimodal.py``)::

    {"prompt": [{"role": "user", "content": "<image>How many circles? Answer in \\boxed{}."}],
     "images": [{"bytes": <PNG>}], "data_source": "shapes",
     "reward_model": {"ground_truth": "3"}, "extra_info": {"index": 0, "split": "train", "question": "count"}}

:func:`boxed_score` is veRL's ``\\boxed{}`` reward (geo3k's accuracy term: the last
``\\boxed{...}`` of the response against the ground truth) without geo3k's 0.1 format bonus,
which a constant ``\\boxed{red}`` would collect on every row: the best constant answer
scores 1/12 (:func:`best_constant_answer`; a test keeps it under 0.2).  The rows of a
``(n, seed, split)`` draw are the same, PNG bytes included.
"""

from __future__ import annotations

import io
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

from bidirl.algo.tasks import Task, register_task

SIZE = 64
CELL = SIZE // 3
COLOURS = {"red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 70, 220), "yellow": (235, 200, 20),
           "purple": (140, 40, 170), "orange": (245, 130, 20)}
KINDS = ("circle", "square", "triangle")
QUESTIONS = {"count": "How many circles? Answer in \\boxed{}.",
             "colour": "What colour is the largest shape? Answer in \\boxed{}."}
ANSWERS = {"count": tuple(str(n) for n in range(1, 7)), "colour": tuple(COLOURS)}
"""Every answer a question can have (what the warm start's random targets draw from, ``models/warm_start_vl.py``)."""


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    cell: int
    """0-8: the 3 x 3 grid cell, row by row."""
    size: int
    """Width and height in pixels."""


def draw(shapes: list[Shape], rng: random.Random) -> bytes:
    """The shapes as a 64 x 64 PNG on white, each in its cell, jittered within it."""
    img = Image.new("RGB", (SIZE, SIZE), "white")
    pen = ImageDraw.Draw(img)
    for s in shapes:
        slack = CELL - s.size
        x = (s.cell % 3) * CELL + rng.randint(0, slack)
        y = (s.cell // 3) * CELL + rng.randint(0, slack)
        box, fill = (x, y, x + s.size - 1, y + s.size - 1), COLOURS[s.colour]
        if s.kind == "circle":
            pen.ellipse(box, fill=fill)
        elif s.kind == "square":
            pen.rectangle(box, fill=fill)
        else:
            pen.polygon([(x + s.size // 2, y), (x, y + s.size - 1), (x + s.size - 1, y + s.size - 1)], fill=fill)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def _count_scene(rng: random.Random) -> tuple[list[Shape], str]:
    circles, others = rng.randint(1, 6), rng.randint(0, 3)
    cells = rng.sample(range(9), circles + others)
    colours = list(COLOURS)
    shapes = [Shape("circle" if i < circles else rng.choice(KINDS[1:]), rng.choice(colours), cell,
                    rng.randint(8, CELL - 2)) for i, cell in enumerate(cells)]
    return shapes, str(circles)


def _colour_scene(rng: random.Random) -> tuple[list[Shape], str]:
    n = rng.randint(2, 5)
    cells = rng.sample(range(9), n)
    largest = rng.randint(16, CELL - 1)
    # Others at most 2/3 as wide: the largest has the most area too, whatever the kinds (a
    # triangle holds half its box, a square all of it: (2/3)^2 < 1/2).
    sizes = [largest] + [rng.randint(6, largest * 2 // 3) for _ in range(n - 1)]
    answer = rng.choice(list(COLOURS))
    shapes = [Shape(rng.choice(KINDS), answer if i == 0 else rng.choice(list(COLOURS)), cell, size)
              for i, (cell, size) in enumerate(zip(cells, sizes, strict=True))]
    return shapes, answer


def shapes_example(rng: random.Random) -> tuple[str, str, bytes, str]:
    """(question text, answer, PNG, question kind), drawn from ``rng``."""
    kind = rng.choice(list(QUESTIONS))
    shapes, answer = (_count_scene if kind == "count" else _colour_scene)(rng)
    return QUESTIONS[kind], answer, draw(shapes, rng), kind


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces kept), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def boxed_score(response: str, target: str) -> float:
    """1.0 when the last ``\\boxed{}`` holds the target (case and spaces aside), else 0.0."""
    answer = last_boxed(response.split("<|", 1)[0])
    return float(answer is not None and answer.strip().lower() == str(target).strip().lower())


def best_constant_answer(rows: list[dict]) -> tuple[str, float]:
    """The constant answer that scores best on these rows under :func:`boxed_score`, exactly:
    the most common ground truth (a wrong answer scores 0, so no other does better)."""
    truths = Counter(str(r["reward_model"]["ground_truth"]).strip().lower() for r in rows)
    answer, n = truths.most_common(1)[0]
    return f"\\boxed{{{answer}}}", n / len(rows)


def _no_text_pair(rng: random.Random) -> tuple[str, str]:
    question, answer, _, _ = shapes_example(rng)
    return question, answer


@dataclass(frozen=True)
class VisualTask(Task):
    """A task whose rows carry an image, in veRL's multimodal layout."""

    example: Callable[[random.Random], tuple[str, str, bytes, str]] = field(default=shapes_example)

    def iter_rows(self, n: int, seed: int = 0, split: str = "train") -> Iterator[dict]:
        rng = random.Random(f"{self.name}:{split}:{seed}")
        for i in range(n):
            question, answer, png, kind = self.example(rng)
            yield {
                "prompt": [{"role": "user", "content": f"<image>{question}"}],
                "images": [{"bytes": png}],
                "data_source": self.name,
                "reward_model": {"ground_truth": answer},
                "extra_info": {"index": i, "split": split, "question": kind},
            }


SHAPES = register_task(VisualTask("shapes", _no_text_pair, boxed_score, warm_start_steps=85, example=shapes_example))
"""``warm_start_steps``: 85 steps of the warm start, part-way up the picture's cliff (``models/warm_start_vl.py``)."""
