"""The README's configuration reference, generated from the models in schema.py so that the docs
and the code cannot drift: `python -m components.reference` prints it."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from . import apikey
from .schema import SECTIONS


def _default_text(field: Any) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "see below"
    return "unset" if value is None else json.dumps(value)


def reference_markdown() -> str:
    """The configuration reference table, generated from the models above."""
    rows = ["| key | default | what it does |", "| --- | --- | --- |"]

    def walk(prefix: str, model: type[BaseModel]) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}.{field.alias or name}"
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(key, annotation)
                continue
            rows.append(f"| `{key}` | `{_default_text(field)}` | {field.description} |")

    for section, model in SECTIONS.items():
        walk(section, model)
    rows.append(
        "| `hfToken` | unset | Hugging Face token for gated models. Secret only: "
        "`pulumi config set --secret hfToken hf_...`. |"
    )
    rows.append(
        "| `apiKey` | generated | The key every API request must carry. Unset: 48 random "
        "characters made once per stack. Yours: at least "
        f"{apikey.MIN_LENGTH} of {apikey.CHARSET_TEXT}, secret only: "
        "`pulumi config set --secret apiKey ...`; a new value and one `pulumi up` rotate it. |"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    print(reference_markdown())
