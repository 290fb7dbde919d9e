"""Every rule, one module per family, in one table keyed by stable code."""

from __future__ import annotations

from ..rule import Rule
from . import data, determinism, distributed, resume, seeding, source

FAMILIES: dict[str, tuple[type[Rule], ...]] = {
    "source": source.RULES,
    "seeding": seeding.RULES,
    "determinism": determinism.RULES,
    "data": data.RULES,
    "distributed": distributed.RULES,
    "resume": resume.RULES,
}
RULES: dict[str, type[Rule]] = {rule.code: rule for family in FAMILIES.values() for rule in family}
BY_NAME: dict[str, type[Rule]] = {rule.name: rule for rule in RULES.values()}


def get_rule(code_or_name: str) -> type[Rule] | None:
    """A rule by code (``TR101``, any case) or by name (``unseeded-rng``)."""
    return RULES.get(code_or_name.upper()) or BY_NAME.get(code_or_name.lower())
