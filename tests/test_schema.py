"""The config model (components/spec/schema.py): every field of every section says what it is
(the reference is generated from the descriptions). Each field's refusal, named by its path, is
checked through the program in test_config.py (REJECTED)."""

from __future__ import annotations

from components.spec import schema


def test_every_config_field_is_documented_with_a_description() -> None:
    for name, model in schema.SECTIONS.items():
        for field_name, field in model.model_fields.items():
            assert field.description, f"{name}.{field_name} has no description"
