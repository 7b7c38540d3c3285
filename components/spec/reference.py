"""The configuration reference (docs/configuration.md), generated from the models in schema.py
so that the docs and the code cannot drift: `python -m components.spec.reference` prints it."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from . import apikey, catalog
from .kube import KubePlatformConfig
from .schema import (
    KUBERNETES_SECTION,
    PLATFORM_DESCRIPTION,
    REPLICAS_DESCRIPTION,
    RETIRED_KEYS,
    SECTIONS,
    set_secret,
)


def _default_text(field: Any) -> str:
    if field.is_required():
        return "required"
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
            default = _default_text(field)
            shown = default if default == "required" else f"`{default}`"
            rows.append(f"| `{key}` | {shown} | {field.description} |")

    rows.append(f'| `platform` | `"droplet"` | {PLATFORM_DESCRIPTION} |')
    rows.append(f"| `replicas` | `1` | {REPLICAS_DESCRIPTION} |")
    for section, model in SECTIONS.items():
        walk(section, model)
    # Read only with `platform: kubernetes` (spec/config.py); required there.
    walk(KUBERNETES_SECTION, KubePlatformConfig)
    rows.append(
        "| `hfToken` | unset | Hugging Face token for gated models. Secret only: "
        f"{set_secret('hfToken')}. |"
    )
    rows.append(
        "| `apiKey` | generated | The key every API request must carry. Unset: 48 random "
        "characters made once per stack. Yours: at least "
        f"{apikey.MIN_LENGTH} of {apikey.CHARSET_TEXT}, secret only: "
        f"{set_secret('apiKey')}; a new value and one `pulumi up` rotate it. |"
    )
    rows += [f"| `{key}` | retired | Refused: {why}. |" for key, why in RETIRED_KEYS.items()]
    return "\n".join(rows)


def serving_sizes(model: catalog.Model, utilization: float = 0.90) -> list[str]:
    """The NVIDIA sizes whose VRAM holds the model's recipe minimum at this utilization."""
    return [
        s.slug
        for s in catalog.SIZES.values()
        if s.vendor == "nvidia"
        and model.runs_on_arch(s)
        and model.vram_gb <= s.total_vram_gb * utilization
    ]


def models_markdown() -> str:
    """The model catalog as a table: what each checkpoint needs and where it runs."""
    rows = [
        "| `model.id` | weights | VRAM (recipe minimum) | disk | serves on (`droplet.size`) | "
        "tool-call parser, MTP, context |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in catalog.MODELS.values():
        sizes = serving_sizes(m)
        if not sizes and m.blackwell_only:
            where = "none: NVFP4 runs on Blackwell only, which DigitalOcean sells per contract"
        else:
            where = ", ".join(f"`{s}`" for s in sizes) or "none that DigitalOcean sells"
        tool = m.vllm_flags[m.vllm_flags.index("--tool-call-parser") + 1]
        mtp = f"MTP {m.mtp_tokens} tokens" if m.mtp_tokens else "no MTP"
        context = f"{m.max_context // 1024}k" + (
            f" ({m.long_context // 1048576}M allowed)" if m.long_context else ""
        )
        rows.append(
            f"| `{m.repo_id}` | {m.precision.upper()} | {m.vram_gb} GB | {m.disk_gb} GB | "
            f"{where} | `{tool}`, {mtp}, {context} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(reference_markdown())
    print()
    print(models_markdown())
