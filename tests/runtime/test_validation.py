"""translate_validation: engine syntax passes, the old documented form is translated."""

from __future__ import annotations

import pytest

from vmsched.runtime.validation import ENGINE_VALIDATION, translate_validation


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("", ""),
        ("   ", ""),
        ("{}", ""),
        ("{ }", ""),
        # engine syntax, accepted as is
        ("mem=[0-9]+", "mem=[0-9]+"),
        ("mem=[0-9]+;", "mem=[0-9]+;"),
        ("mem=[0-9]+;cpu=[0-9]{1,3}", "mem=[0-9]+;cpu=[0-9]{1,3}"),
        ("a_1=x|y;B2=(true|false);", "a_1=x|y;B2=(true|false);"),
        ("  mem=[0-9]+  ", "mem=[0-9]+"),
        ("re=a=b", "re=a=b"),  # '=' inside the regex is fine for the engine
        ("mem=[0-9]+, cpu=[0-9]+", "mem=[0-9]+, cpu=[0-9]+"),  # valid engine syntax: one regex with a comma
        # the old documented form
        ("{mem = [0-9]+}", "mem=[0-9]+"),
        ("{mem = [0-9]+, cpu = [0-9]+}", "mem=[0-9]+;cpu=[0-9]+"),
        ("{mem: [0-9]+, cpu: [0-9]+}", "mem=[0-9]+;cpu=[0-9]+"),
        ("{ 'mem' : '[0-9]+' , \"cpu\" = \"[0-9]+\" }", "mem=[0-9]+;cpu=[0-9]+"),
        ('{"mem": "[0-9]+", "cpu": "\\\\d+"}', "mem=[0-9]+;cpu=\\d+"),  # a dict literal, escapes honoured
        ("{'threshold': 10}", "threshold=10"),
        ("{mem = [0-9]+,}", "mem=[0-9]+"),
        ("{\n  mem = [0-9]+,\n  cpu = [0-9]+\n}", "mem=[0-9]+;cpu=[0-9]+"),
        # commas inside the regexes stay
        ("{n = [0-9]{1,3}, m = [a,b]+}", "n=[0-9]{1,3};m=[a,b]+"),
        ("{n = (x|y){2,}, m = [^,]+}", "n=(x|y){2,};m=[^,]+"),
        ("{n = (?:a|b)}", "n=(?:a|b)"),  # ':' inside the regex is not a separator
        ("{n = a:b}", "n=a:b"),
        # braceless relatives
        ("mem = [0-9]+", "mem=[0-9]+"),
        ("mem = [0-9]+, cpu = [0-9]{2}", "mem=[0-9]+;cpu=[0-9]{2}"),
        ("mem = [0-9]+; cpu = [0-9]+", "mem=[0-9]+;cpu=[0-9]+"),
        ("mem: [0-9]+", "mem=[0-9]+"),
        # an empty regex: the current engine accepts it
        ("flag=", "flag="),
        ("a=[0-9]+;flag=;", "a=[0-9]+;flag=;"),
        ("{mem = }", "mem="),
    ],
)
def test_translates(raw: str, expected: str) -> None:
    assert translate_validation(raw) == (expected, None)
    assert ENGINE_VALIDATION.fullmatch(expected)


@pytest.mark.parametrize(
    "raw, reason",
    [
        ("{mem = [0-9+}", "the regex of 'mem' does not compile"),
        ("mem=(abc", "the regex of 'mem' does not compile"),
        ("{my-key = x}", "key 'my-key' may contain only letters, digits and '_'"),
        ("{= x}", "key '' may contain only letters, digits and '_'"),
        ("{mem = x, mem = y}", "key 'mem' appears twice"),
        ("{mem = [0-9]+", "starts with '{' but does not end with '}'"),
        ("mem = [0-9]+}", "ends with '}' but does not start with '{'"),
        ("just some words", "entry 'just some words' is not KEY=REGEX"),
        ("{a b = c}", "is not KEY=REGEX"),
        ("{'mem': ['0-9']}", "is not KEY: REGEX"),
        ("{'a;b': 'x'}", "key 'a;b' may contain only"),
        ('{"mem": "a;b"}', "contains ';'"),
        ("{mem = a\\}", "does not compile"),
    ],
)
def test_rejects_with_a_precise_reason(raw: str, reason: str) -> None:
    translated, error = translate_validation(raw)
    assert translated == ""
    assert error is not None
    assert reason in error
    assert repr(raw) in error


def test_not_a_string() -> None:
    assert translate_validation(42) == ("", "properties_validation must be a string, not int")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, valid",
    [
        ("", True),
        ("a=b", True),
        ("a=b;", True),
        ("a=b;c=d", True),
        ("a=b;;", False),
        (";", False),
        ("a", False),
        ("a=", True),  # the current engine (common CustomPropertiesUtils, [^;]*) accepts an empty regex
        ("a b=c", False),
        ("{a=b}", False),
        ("a=b;c", False),
        ("-=x", False),
    ],
)
def test_engine_syntax(text: str, valid: bool) -> None:
    assert bool(ENGINE_VALIDATION.fullmatch(text)) is valid
