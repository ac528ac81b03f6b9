"""Default owners of dead letters: EXPIRY_DEAD_LETTER_OWNERS parsed, checked and matched."""

from __future__ import annotations

import pytest

from service.core.default_owners import (
    DEFAULT_OPERATOR,
    OwnerRule,
    default_owner,
    parse_owner_rules,
)
from service.core.errors import ConfigError
from service.settings import load_settings

SETTING = "db.*=team-db, poison.*=team-producers ,*=on-call"
RULES = parse_owner_rules(SETTING)


def test_pairs_are_read_in_order_with_spaces_and_empty_entries_dropped() -> None:
    """Each PATTERN=OWNER pair becomes a rule, in the order given; blanks around are trimmed."""
    assert parse_owner_rules(SETTING) == (
        OwnerRule("db.*", "team-db"),
        OwnerRule("poison.*", "team-producers"),
        OwnerRule("*", "on-call"),
    )
    assert parse_owner_rules(" , ") == ()
    assert parse_owner_rules("") == ()
    assert parse_owner_rules("a=b=c") == (OwnerRule("a", "b=c"),)  # the first = splits


@pytest.mark.parametrize(
    ("error_class", "owner"),
    [
        ("db.unavailable", "team-db"),
        ("db.lock-timeout", "team-db"),
        ("poison.not-json", "team-producers"),
        ("delivery-limit", "on-call"),
        ("DB.unavailable", "on-call"),  # case-sensitive, as error classes are
        ("db", "on-call"),  # db.* needs the dot
    ],
)
def test_the_first_matching_pattern_names_the_owner(error_class: str, owner: str) -> None:
    """Shell-style patterns are tried in order and the first that matches wins."""
    rule = default_owner(RULES, error_class)
    assert rule is not None
    assert rule.owner == owner


def test_no_rule_matches_no_owner() -> None:
    """Without a matching rule (or without rules) a dead letter has no default owner."""
    assert default_owner(parse_owner_rules("db.*=team-db"), "poison.not-json") is None
    assert default_owner((), "db.unavailable") is None


def test_the_audit_detail_names_the_owner_and_the_pattern() -> None:
    """An assignment's audit says who, and which pattern chose them, as whom."""
    assert OwnerRule("db.*", "team-db").detail() == "team-db (error class matched db.*)"
    assert DEFAULT_OPERATOR == "default (EXPIRY_DEAD_LETTER_OWNERS)"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("team-db", "entry 1 is not PATTERN=OWNER (e.g. db.*=team-db,"),
        ("db.*=a,=b", "entry 2 is not PATTERN=OWNER"),
        ("db.*=", "entry 1 is not PATTERN=OWNER"),
        ("db.*=" + "x" * 65, "entry 1: the owner must be printable and at most 64 long"),
        ("db.*=team\x1bdb", "entry 1: the owner must be printable"),
        ("x" * 65 + "=a", "entry 1: the pattern must be printable and at most 64 long"),
        ("*=on-call,db.*=team-db", "db.*=team-db comes after *, which matches first"),
        ("db.*=a,db.*=b", "the pattern db.* is listed twice; the first one wins"),
    ],
)
def test_a_bad_value_is_refused_at_start_with_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    """load_settings refuses it with one line: the setting's name, then what is wrong."""
    monkeypatch.setenv("EXPIRY_DEAD_LETTER_OWNERS", value)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    [line] = str(refused.value).splitlines()
    assert line.startswith(f"EXPIRY_DEAD_LETTER_OWNERS: {message}")
    assert "\x1b" not in line


def test_the_settings_default_to_no_owner_and_a_day(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset: no default owner, and dead letters may stay open a day; both can be set."""
    settings = load_settings()
    assert (settings.dead_letter_owners, settings.dead_letter_age_objective_seconds) == (
        (),
        86400.0,
    )
    monkeypatch.setenv("EXPIRY_DEAD_LETTER_OWNERS", "poison.*=team-producers")
    monkeypatch.setenv("EXPIRY_DEAD_LETTER_AGE_OBJECTIVE_SECONDS", "3600")
    settings = load_settings()
    assert settings.dead_letter_owners == (OwnerRule("poison.*", "team-producers"),)
    assert settings.dead_letter_age_objective_seconds == 3600.0


@pytest.mark.parametrize("value", ["0", "-5", "a day"])
def test_a_bad_age_objective_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """The age objective must be a positive number of seconds."""
    monkeypatch.setenv("EXPIRY_DEAD_LETTER_AGE_OBJECTIVE_SECONDS", value)
    with pytest.raises(ConfigError, match=r"^EXPIRY_DEAD_LETTER_AGE_OBJECTIVE_SECONDS: "):
        load_settings()
