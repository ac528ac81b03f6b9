"""Who owns a dead letter from the moment it is recorded: ``EXPIRY_DEAD_LETTER_OWNERS``.

The setting is a list of ``PATTERN=OWNER`` pairs, read in order; a dead letter's error
class is matched against each shell-style pattern (``fnmatchcase``: ``db.*``, ``*``),
and the first that matches names its owner. Pure: the recorder assigns the owner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

SETTING = "EXPIRY_DEAD_LETTER_OWNERS"
# The operator an automatic assignment is audited as (dead_letter_events.operator).
DEFAULT_OPERATOR = f"default ({SETTING})"
OWNER_LIMIT = 64  # as an operator's name (EXPIRY_REPLAY_OPERATORS)
PATTERN_LIMIT = 64  # as an error class
EXAMPLE = "db.*=team-db,poison.*=team-producers,*=on-call"


@dataclass(frozen=True)
class OwnerRule:
    """Dead letters whose error class matches ``pattern`` belong to ``owner``."""

    pattern: str
    owner: str

    def detail(self) -> str:
        """The audit's detail of an assignment by this rule: the owner, and why."""
        return f"{self.owner} (error class matched {self.pattern})"


def parse_owner_rules(text: str) -> tuple[OwnerRule, ...]:
    """The rules of ``PATTERN=OWNER,...`` (empty: none); ``ValueError`` says which entry is
    wrong and how, never quoting more of it than a bounded, printable name."""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    rules = tuple(_rule(number, entry) for number, entry in enumerate(entries, 1))
    _check_reachable(rules)
    return rules


def _rule(number: int, entry: str) -> OwnerRule:
    pattern, equals, owner = (part.strip() for part in entry.partition("="))
    if not equals or not pattern or not owner:
        raise ValueError(f"entry {number} is not PATTERN=OWNER (e.g. {EXAMPLE})")
    if len(pattern) > PATTERN_LIMIT or not pattern.isprintable():
        raise ValueError(
            f"entry {number}: the pattern must be printable and at most {PATTERN_LIMIT} long"
        )
    if len(owner) > OWNER_LIMIT or not owner.isprintable():
        raise ValueError(
            f"entry {number}: the owner must be printable and at most {OWNER_LIMIT} long"
        )
    return OwnerRule(pattern, owner)


def _check_reachable(rules: Iterable[OwnerRule]) -> None:
    """Refuse a rule that can never match: the first match wins, so a pattern listed twice
    or after ``*`` would be ignored without a word."""
    seen: set[str] = set()
    for rule in rules:
        if "*" in seen:
            raise ValueError(f"{rule.pattern}={rule.owner} comes after *, which matches first")
        if rule.pattern in seen:
            raise ValueError(f"the pattern {rule.pattern} is listed twice; the first one wins")
        seen.add(rule.pattern)


def default_owner(rules: Iterable[OwnerRule], error_class: str) -> OwnerRule | None:
    """The first rule whose pattern matches ``error_class`` (case-sensitive), or None."""
    return next((rule for rule in rules if fnmatchcase(error_class, rule.pattern)), None)
