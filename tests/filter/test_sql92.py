"""SQL92 selectors behave like a RocketMQ 4.9 broker's (apache/rocketmq filter/ and broker/filter/).

The cases of RocketMQ's ExpressionTest and ParserTest that apply to String properties are ported
first; then the String-to-number conversions, null logic, literals, precedence, the parts of the
grammar Java leaves open (trailing input) and every parse-time error, and this module's limits.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from smartgo.filter import Selector, SelectorError, compile_selector
from smartgo.filter.sql92 import MAX_EXPRESSION_LENGTH, MAX_NESTING, MAX_TREE_DEPTH, _build, _Parser

pytestmark = pytest.mark.timeout(30)


def m(expr: str, **props: str) -> bool:
    return compile_selector(expr).matches(props)


def tri(expr: str, **props: str) -> bool | None:
    """The three-valued result, seen only through matches(): TRUE, FALSE or NULL-or-error."""
    if m(expr, **props):
        return True
    if m(f"NOT ({expr})", **props):
        return False
    return None


def rejected(expr: str) -> SelectorError:
    with pytest.raises(SelectorError) as info:
        compile_selector(expr)
    return info.value


# --- ported from RocketMQ ExpressionTest (String-valued properties) --------------------------

AND_EXPR = "a=3 and b<>4 And c>5 AND d<=4"
OR_EXPR = "a=3 or b<>4 Or c>5 OR d<=4"


def test_string_with_escaped_quotes():
    assert m("TAGS is not null and TAGS='''''tag'''''", TAGS="''tag''")
    assert not m("TAGS is not null and TAGS='''''tag'''''", TAGS="'tag'")


def test_string_compare_cases():
    expr = "a between up and low"
    assert not m(expr, a="3.14")  # bounds missing: null
    assert not m(expr, a="3.14", up="up", low="low")  # Double.valueOf("up") throws
    assert not m("key is not null and key between 0 and 100", key="con")
    assert not m("a between 0 and 100", a="abc")
    assert m("a=b", a="3.14", b="3.14")
    assert not m("a<>b", a="3.14", b="3.14")
    assert m("a<>b", a="3.14", b="3.141")


def test_exponent_and_float():
    assert m("a > 3.1E10", a="3.1415E10")  # String.valueOf(3.1415 * 10^10) in Java
    assert m("a > 3.14", a="3.1415")
    assert not m("a > 3.14", a="3.14")


def test_two_variables_compare_as_doubles():
    assert not m("a > b", a="10", b="20")
    assert m("a > b", a="20", b="10")
    assert m("a > b", a="10", b="9")  # numerically, not "10" < "9" as strings


def test_null_or():
    expr = "a is null OR a='hello'"
    assert m(expr)
    assert m(expr, a="hello")
    assert not m(expr, a="abc")


def test_boolean_literals_against_strings():
    expr = "a=TRUE OR b=FALSE"
    assert m(expr, a="true", b="false")
    assert not m(expr, a="false", b="true")


def test_equal_and_not_null():
    assert m("a is not null and a='hello'", a="hello")
    assert not m("a is not null and a='hello'")


def test_and_expression():
    assert m(AND_EXPR, a="3", b="5", c="6", d="1")
    assert not m(AND_EXPR, a="4", b="5", c="6", d="1")


def test_or_expression():
    assert m(OR_EXPR, a="3")
    assert m(OR_EXPR, a="4", b="5")
    assert m(OR_EXPR, a="4", b="4", c="6")
    assert m(OR_EXPR, a="4", b="4", c="3", d="2")
    assert not m(OR_EXPR, a="4", b="4", c="3", d="10")


def test_in_and_not_in():
    for v in ("3", "4", "5"):
        assert m("a in ('3', '4', '5')", a=v)
        assert not m("a not in ('3', '4', '5')", a=v)
    assert not m("a in ('3', '4', '5')", a="8")
    assert m("a not in ('3', '4', '5')", a="8")


def test_between_and_not_between():
    for v in ("2", "10", "3"):
        assert m("a between 2 and 10", a=v)
        assert not m("a not between 2 and 10", a=v)
    for v in ("1", "11"):
        assert not m("a between 2 and 10", a=v)
        assert m("a not between 2 and 10", a=v)


def test_is_null_and_is_not_null():
    assert m("a is null", abc="2")
    assert not m("a is null", a="2")
    assert m("a is not null", a="2")
    assert not m("a is not null", abc="2")


# --- ported from RocketMQ ParserTest ------------------------------------------------------------

@pytest.mark.parametrize("expr", [
    AND_EXPR, "a=3  and    b<>4 And c>5 AND d<=4", OR_EXPR, "a in ('3', '4', '5')",
    "(a not in ('6', '4', '5')) or (b in ('3', '4', '5'))", "(a between 2 and 10) AND (b not between 6 and 9)",
    "a is null", "a is not null", "a <= now"])
def test_parser_valid(expr):
    assert compile_selector(expr).expression == expr


def test_parser_invalid_between_without_left_operand():
    rejected("a and between 2 and 10")


def test_parser_decimal_overflow():
    rejected("a > 100000000000000000000000")


def test_parser_float_overflow():
    rejected("a > " + "1" * 400 + "." + "1" * 400)


def test_parser_illegal_between():
    assert "BETWEEN" in str(rejected(" a between 10 and 0"))


def test_now_is_just_a_property():
    assert m("a <= now", a="5", now="6")
    assert not m("a <= now", a="5")


# --- point 1: a String property against a number (CONVERT_STRING_EXPRESSIONS is on) -----------

@pytest.mark.parametrize("expr, value, expected", [
    # Integer literal: Integer.valueOf(property) -- sign and digits only, 32 bits.
    ("a > 5", "6", True), ("a > 5", "5", False), ("a > 5", "6.5", False), ("a > 5", " 6", False),
    ("a > 5", "+6", True), ("a > 5", "06", True), ("a > 5", "abc", False), ("a > 5", "", False),
    ("a > 5", "\u0666", True),  # ARABIC-INDIC DIGIT SIX: Character.digit accepts any Nd digit
    ("a > 5", "1e3", False), ("a > 5", "6L", False),
    ("a = 6", "6", True), ("a = 6", "+06", True), ("a = 6", "6.0", False), ("a = 6", "x", False),
    ("a <> 6", "7", True), ("a <> 6", "6", False), ("a <> 6", "x", False), ("a <> 6", "6.0", False),
    ("a BETWEEN 0 AND 3", "2", True), ("a BETWEEN 0 AND 3", "0", True), ("a BETWEEN 0 AND 3", "3", True),
    ("a BETWEEN 0 AND 3", "4", False), ("a BETWEEN 0 AND 3", "2.5", False), ("a BETWEEN 0 AND 3", "-1", False),
    ("a NOT BETWEEN 0 AND 3", "2.5", False), ("a NOT BETWEEN 0 AND 3", "7", True),
    ("a > 2147483646", "2147483647", True), ("a > 2147483647", "2147483648", False),  # Integer overflow
    ("a > 2147483648", "2147483649", True), ("a > 2147483648", "9223372036854775808", False),  # Long
    ("a = 5L", "5", True),
    # Double literal: Double.valueOf(property) -- trimmed, exponents, NaN, Infinity, hex, suffixes.
    ("a > 5.5", "6", True), ("a > 5.5", "5.5", False), ("a > 5.5", " 6.5\t", True), ("a > 5.5", "6.5f", True),
    ("a > 5.5", "6.5D", True), ("a > 5.5", "1e1", True), ("a > 5.5", "0x1.8p3", True), ("a > 5.5", "NaN", True),
    ("a > 5.5", "Infinity", True), ("a > 5.5", "-Infinity", False), ("a > 5.5", "infinity", False),
    ("a > 5.5", "abc", False), ("a > 5.5", "6_0", False), ("a > 5.5", "\u0666", False), ("a > 5.5", "\u00a06", False),
    ("a < 5.5", "NaN", False), ("a = 1.5", "1.50", True), ("a = 1.5", "15e-1", True), ("a <> 1.5", "x", False),
    ("a = 0.5", "5e-1", True), ("a >= 1.5", "1.5", True), ("a <= 1.5", "1.5", True),
    # A literal on the left converts the property the same way.
    ("5 < a", "6", True), ("5 < a", "6.5", False), ("5.5 < a", "6", True), ("6 = a", "06", True),
    ("2147483648 <= a", "2147483648", True),
    # Negated literals keep their type.
    ("a > -5", "-4", True), ("a > -5", "-6", False), ("a > -5.5", "-5", True), ("-5 < a", "-4", True),
    ("a > - -5", "6", True), ("a = -2147483648", "-2147483648", True),
    # Strings compare as strings with = and <>, never numerically.
    ("a = '6'", "6", True), ("a = '6'", "6.0", False), ("a = 'abc'", "ABC", False),
    ("a IN ('1', '2')", "01", False), ("a IN ('1', '2')", "1", True),
    # TRUE / FALSE: Boolean.valueOf(property), "true" in any case.
    ("a = TRUE", "true", True), ("a = TRUE", "TrUe", True), ("a = TRUE", "yes", False), ("a = TRUE", "1", False),
    ("a = FALSE", "yes", True), ("a <> TRUE", "yes", True),
    # A Boolean on the left of a String is a ClassCastException in Java: never a match.
    ("TRUE = a", "true", False), ("TRUE <> a", "true", False), ("FALSE = a", "false", False),
])
def test_property_against_literal(expr, value, expected):
    assert m(expr, a=value) is expected


def test_two_properties():
    assert not m("a = b", a="1", b="1.0")  # = compares two Strings as strings
    assert m("a <> b", a="1", b="1.0")
    assert m("a > b", a="2", b="1.5")  # > parses both as Double
    assert m("a >= b", a="1", b="1.0")
    assert not m("a > b", a="2", b="x")  # Double.valueOf("x") throws
    assert m("a BETWEEN lo AND hi", a="5", lo="1.5", hi="1e1")


def test_literal_against_literal():
    assert m("5 > 3")
    assert m("1 = 1.0")  # Integer widened to Double
    assert m("2147483648 > 5")
    assert not m("5 = TRUE")  # unrelated types compare as "less"
    assert m("5 <> TRUE")
    assert m("'true' = TRUE")  # String converted by Boolean.valueOf
    assert m("FALSE = FALSE")


# --- point 2: nulls, three-valued logic, errors -------------------------------------------------

@pytest.mark.parametrize("left, right, and_, or_", [
    ("TRUE", "TRUE", True, True), ("TRUE", "FALSE", False, True), ("TRUE", "NULL", None, True),
    ("FALSE", "TRUE", False, True), ("FALSE", "FALSE", False, False), ("FALSE", "NULL", False, None),
    ("NULL", "TRUE", None, True), ("NULL", "FALSE", False, None), ("NULL", "NULL", None, None),
])
def test_and_or_truth_tables(left, right, and_, or_):
    assert tri(f"{left} AND {right}") is and_
    assert tri(f"{left} OR {right}") is or_
    # the same with nulls coming from missing properties
    sub = {"TRUE": "p = '1'", "FALSE": "p = '2'", "NULL": "missing = '1'"}
    assert tri(f"{sub[left]} AND {sub[right]}", p="1") is and_
    assert tri(f"{sub[left]} OR {sub[right]}", p="1") is or_


def test_not_truth_table():
    assert tri("NOT TRUE") is False
    assert tri("NOT FALSE") is True
    assert tri("NOT NULL") is None
    assert tri("NOT (a = 'x')") is None


def test_missing_property_is_null_everywhere():
    for expr in ("a = 'x'", "a <> 'x'", "a > 1", "a < 1", "a IN ('x')", "a NOT IN ('x')",
                 "a BETWEEN 1 AND 2", "a NOT BETWEEN 1 AND 2", "a", "NOT a", "-a = 1"):
        assert tri(expr) is None, expr
    assert m("a IS NULL")
    assert not m("a IS NOT NULL")


def test_equality_with_nulls_is_asymmetric():
    # doCreateEqual: null only when the left side alone is null; FALSE when the right side alone
    # is; TRUE when both are.
    assert m("a = b")
    assert tri("a = b", b="x") is None
    assert tri("a = b", a="x") is False
    assert m("a <> b", a="x")
    assert not m("a <> b", b="x")
    assert tri("'x' = a") is False
    assert m("'x' <> a")
    assert not m("a <> 'x'")
    assert m("TRUE <> a")
    assert m("a = -NULL")  # -NULL is null but not the NULL literal, so it may be compared
    assert not m("a = -NULL", a="x")


def test_evaluation_error_is_not_null():
    # An exception aborts the whole evaluation; null does not.
    assert m("a > 5 OR b = 'y'", b="y")  # null OR TRUE
    assert not m("a > 5 OR b = 'y'", a="x", b="y")  # error OR ...
    assert m("b = 'y' OR a > 5", a="x", b="y")  # short-circuit: the error is never reached
    assert m("NOT (b = 'z' AND a > 5)", a="x", b="y")  # FALSE AND ... short-circuits
    assert not m("NOT (a > 5 AND b = 'z')", a="x", b="y")
    assert not m("NOT (a > 5)", a="x")


def test_bare_property_is_never_true():
    assert not m("a", a="true")
    assert not m("a")
    assert m("NOT a", a="anything")  # present: FALSE, so NOT is TRUE
    assert not m("NOT a")
    assert m("a OR TRUE", a="x")
    assert not m("(a) AND TRUE", a="true")


def test_constant_selectors():
    assert m("TRUE")
    assert not m("FALSE")
    assert not m("NULL")
    assert not m("NOT NULL")
    assert m("NOT FALSE")


# --- point 3: literals, keywords, identifiers, comments ---------------------------------------

def test_string_literal_escapes():
    assert m("a = 'it''s'", a="it's")
    assert m("a = ''''", a="'")
    assert m("a = ''", a="")
    assert m("a = 'two\nlines é ☃ 😀'", a="two\nlines é ☃ 😀")
    assert m("a IN ('x''y', 'z')", a="x'y")
    assert m("a IS NOT NULL", a="")


def test_keywords_are_case_insensitive():
    assert m("a iS nOt NuLl aNd a bEtWeEn 1 AnD 3 oR fAlSe", a="2")
    assert m("a = tRuE", a="true")
    assert m("a nOt In ('x')", a="y")
    assert m("a Is NuLl")
    assert m("a=1AND b='2'", a="1", b="2")  # "1AND" lexes as 1, AND
    assert m("a=1ANDb='2'", a="1", b="3")  # but "ANDb" is an identifier: ignored trailing input


def test_identifiers():
    assert not m("A = '1'", a="1")  # names are case-sensitive
    assert m("$x_1 = '1'", **{"$x_1": "1"})
    assert m("_a = '1'", _a="1")
    assert m("TAGS = 'TagA' AND KEYS = 'k'", TAGS="TagA", KEYS="k")
    assert m("nulls = '1' AND notes = '2' AND island = '3'", nulls="1", notes="2", island="3")
    assert m("contains = 'x' AND startswith = 'y'", contains="x", startswith="y")  # 5.x words, not 4.9's
    rejected("\u00e9 = '1'")  # identifiers are ASCII only
    rejected("a.b = '1'")  # '.' must start a number


def test_decimal_literals():
    assert m("a = 9223372036854775807", a="9223372036854775807")
    assert m("a = 9223372036854775807L", a="9223372036854775807")
    rejected("a = 9223372036854775808")
    assert m("a = 0", a="0")


def test_no_hex_or_octal_literals():
    # The grammar dropped them: "0x1F" is the literal 0 followed by an ignored identifier,
    # "010" is 0 followed by an ignored 10.
    assert m("a = 0x1F", a="0")
    assert not m("a = 0x1F", a="31")
    assert m("a = 010", a="0")
    assert not m("a = 010", a="8")
    assert not m("a = 010", a="10")


@pytest.mark.parametrize("literal, value", [
    ("1.", "1"), (".5", "0.5"), ("5E1", "50"), ("5e1", "50"), ("1.5e+1", "15"), ("15e-1", "1.5"), (".5E1", "5"),
    ("4.9e-324", "4.9E-324"), ("1.7976931348623157E308", "1.7976931348623157E308"), ("007.5", "7.5")])
def test_floating_literals(literal, value):
    assert m(f"a = {literal}", a=value)


@pytest.mark.parametrize("literal", ["0.0", "0.", ".0", "0e5", "000.000", "1e-400", "1e309", "1.8E308"])
def test_floating_literals_that_java_rejects(literal):
    # createFloat refuses Infinity and anything below Double.MIN_VALUE -- which includes zero.
    rejected(f"a > {literal}")


def test_comments_and_whitespace():
    assert m("a = /* note */ '1'", a="1")
    assert m("a = '1' -- note\n AND b = '2'", a="1", b="2")
    assert not m("a = '1' -- note\n AND b = '2'", a="1")
    assert m("a = '1' -- no newline: '-' tokens, ignored", a="1")
    assert m("\t\r\n\fa\f=\t'1'\r\n", a="1")
    assert m("a = /***/ '1' /* ** / * */", a="1")
    rejected("a = '1' \v")  # vertical tab is not whitespace in the grammar
    rejected("a = \u00a0'1'")


# --- IN / NOT IN ------------------------------------------------------------------------------

def test_in_lists():
    many = ", ".join(f"'v{i}'" for i in range(20))
    assert m(f"a IN ({many})", a="v13")
    assert not m(f"a IN ({many})", a="v20")
    assert m(f"a NOT IN ({many})", a="v20")
    assert m("(a) IN ('x')", a="x")
    assert m("+a IN ('x')", a="x")
    assert m("a IN ('x') = TRUE", a="x")


@pytest.mark.parametrize("expr", [
    "a IN ()", "a IN ('x',)", "a IN ('x', 1)", "a IN (b)", "a IN 'x'", "a IN ('x'", "'x' IN ('x')",
    "-a IN ('x')", "(a = 'x') IN ('x')", "a NOT IN ()", "a IN (NULL)", "5 NOT IN ('5')"])
def test_in_errors(expr):
    rejected(expr)


# --- BETWEEN / NOT BETWEEN --------------------------------------------------------------------

def test_between_details():
    assert m("a BETWEEN 1 AND 1", a="1")
    assert m("a BETWEEN 1 AND 2 AND b = 'x'", a="1", b="x")
    assert not m("a BETWEEN 1 AND 2 AND b = 'x'", a="1", b="y")
    # Mixed bounds convert the property twice: Double for 1.5, Integer for 2.
    assert m("a BETWEEN 1.5 AND 2", a="2")
    assert not m("a BETWEEN 1.5 AND 2", a="1.75")  # Integer.valueOf("1.75") throws
    # The bound check only applies to plain literals; a negated bound is an expression.
    assert compile_selector("a BETWEEN -5 AND -10")
    assert not m("a BETWEEN -5 AND -10", a="-7")
    assert m("a NOT BETWEEN 3 AND 1", a="2")  # NOT BETWEEN has no bound check at all
    assert m("a BETWEEN +1 AND 2", a="1")


@pytest.mark.parametrize("expr", [
    "a BETWEEN 3 AND 1", "a BETWEEN 2.5 AND 2", "a BETWEEN 3 AND 2.5", "a BETWEEN (3) AND (1)", "a BETWEEN +3 AND 1",
    "a BETWEEN NULL AND 1", "a BETWEEN 1 AND NULL", "a BETWEEN 'a' AND 'b'", "a BETWEEN 1 AND 'b'",
    "a BETWEEN TRUE AND FALSE", "a BETWEEN 1 AND TRUE", "a BETWEEN 1", "a BETWEEN 1 OR 2", "a NOT BETWEEN 'a' AND 'b'",
    "a NOT BETWEEN NULL AND 1", "'x' BETWEEN 1 AND 2", "(a = 1) BETWEEN 1 AND 2"])
def test_between_errors(expr):
    rejected(expr)


# --- IS [NOT] NULL ------------------------------------------------------------------------------

def test_is_null_details():
    assert m("a = 'x' IS NULL")  # (a = 'x') IS NULL: a missing makes the comparison null
    assert not m("a = 'x' IS NULL", a="y")
    assert m("NOT a IS NULL")  # (NOT a) IS NULL, i.e. a IS NULL
    assert not m("NOT a IS NULL", a="x")
    assert m("NULL IS NULL")
    assert m("'x' IS NOT NULL")
    assert m("a IS NULL IS NOT NULL")


@pytest.mark.parametrize("expr", ["a IS TRUE", "a IS NOT", "a IS", "a IS NOT TRUE", "a ISNULL", "a IS NULL NULL x"])
def test_is_null_errors(expr):
    if expr == "a ISNULL" or expr == "a IS NULL NULL x":
        # "ISNULL" is one identifier and NULL after a complete expression is trailing input.
        assert compile_selector(expr)
    else:
        rejected(expr)


# --- point 5: precedence and associativity --------------------------------------------------------

def test_and_binds_tighter_than_or():
    expr = "a = '1' OR b = '1' AND c = '1'"
    assert m(expr, a="1")
    assert not m(expr, b="1")
    assert m(expr, b="1", c="1")
    assert not m("(a = '1' OR b = '1') AND c = '1'", a="1")


def test_not_is_unary():
    # NOT binds to the operand, not to the comparison: (NOT a) = 'x' compares a Boolean with a
    # String (ClassCastException) or is null -- it never matches.
    for props in ({"a": "x"}, {"a": "y"}, {}):
        assert not m("NOT a = 'x'", **props)
    assert m("NOT (a = 'x')", a="y")
    assert m("NOT NOT (a = 'x')", a="x")
    assert m("NOT TRUE = FALSE")  # (NOT TRUE) = FALSE
    rejected("NOT a > 1")  # (NOT a) > 1: a boolean cannot be ordered
    rejected("NOT a IN ('x')")


def test_comparison_binds_tighter_than_equality():
    assert m("a > 1 = TRUE", a="2")  # (a > 1) = TRUE
    assert not m("a > 1 = TRUE", a="0")
    assert m("a = 'x' = TRUE", a="x")
    assert not m("a = 'x' = 'true'", a="x")  # Boolean on the left of a String: error
    assert m("'true' = (a = 'x')", a="x")


def test_equality_chain_associativity():
    # Left-associative: (a = b) = c.  All missing: a = b is TRUE, TRUE = null is FALSE.
    assert tri("a = b = c") is False
    assert tri("c = (a = b)") is None  # null on the left now
    assert tri("a = b = c", c="x") is None  # TRUE = 'x': Boolean on the left of a String, an error
    assert not m("a = b = c", a="1", b="2", c="false")  # FALSE = 'false': the same error
    assert m("c = (a = b)", a="1", b="2", c="false")  # 'false' = FALSE: Boolean.valueOf("false")
    rejected("a > 1 > 2")  # (a > 1) > 2: a boolean cannot be ordered


def test_unary_plus_and_minus():
    assert m("a = +1", a="1")
    assert m("+a = '1'", a="1")
    assert m("a = - - - 1", a="-1")
    assert tri("-a = 1", a="1") is None  # the negation of a String is null
    assert tri("-'x' = a", a="1") is None
    rejected("a > +'x'")  # unary plus is no-op: still a string literal
    assert compile_selector("a > -'x'")  # a negation is an expression, not a literal


def test_no_arithmetic():
    assert m("a = 1 + 2", a="1")  # "+ 2" is trailing input, ignored
    assert not m("a = 1 + 2", a="3")
    rejected("a = 2 * 3")  # '*' is not a token
    rejected("a = 6 / 3")  # '/' only starts a comment


# --- the parser reads the longest valid prefix and ignores the rest -------------------------------

def test_trailing_input_is_ignored():
    assert m("a = '1' garbage", a="1")
    assert m("a = '1' b = '2'", a="1")
    assert not m("a = '1' b = '2'", a="2", b="2")
    assert m("a = '1' )", a="1")
    assert m("a = '1' , 'x'", a="1")
    assert m("a = '1' x 'never scanned", a="1")
    assert m("a = '1' x #", a="1")
    assert compile_selector("a CONTAINS 'x'")  # 4.9 has no CONTAINS: a bare property, never TRUE
    assert not m("a CONTAINS 'x'", a="xyz")
    assert not m("a-b = '1'", a="1")  # just "a"


@pytest.mark.parametrize("expr", [
    "a = '1' #", "a = '1' 'unterminated", "a = '1' /* unterminated", "a = '1' AND", "a = '1' OR",
    "a = '1' NOT x", "a = '1' IS x", "a = '1' =", "a = '1' >", "a = '1' .", "a = '1' !", "a = '1' \"x\""])
def test_trailing_input_that_is_still_rejected(expr):
    # the first token after the prefix is always scanned, and an operator there continues the parse
    rejected(expr)


# --- point 4: every class of parse error --------------------------------------------------------

@pytest.mark.parametrize("expr", [
    "", "   ", "/* only a comment */", "-- only a comment\n",
    "a > 'x'", "'x' < a", "a >= TRUE", "FALSE <= a", "a > NULL", "NULL < a", "a > (b = 1)", "(b = 1) < a",
    "a = NULL", "NULL = a", "a <> NULL", "NULL <> NULL",
    "TRUE = 'x'", "TRUE = 1", "FALSE <> 1.5", "(TRUE) = 'x'",
    "5", "'x'", "1.5", "-a", "a AND 5", "5 OR a", "NOT 'x'", "NOT -a", "-TRUE",
    "a ==  1", "a != 1", "a = ", "(a = 1", "()", "a IN", "= a",
    "a = 'x", "a = 1 #", "#", "a = '1' AND b = \"2\"", ".",
])
def test_parse_errors(expr):
    err = rejected(expr)
    assert str(err).startswith("Invalid MessageSelector")


def test_error_carries_position():
    err = rejected("a = 'x' AND b > 'y'")
    assert err.position == 14
    assert "line 1, column 15" in str(err)
    assert rejected("a = 1 AND\n  b = 1 #").position == 18
    assert isinstance(err, ValueError)


def test_tokens_that_look_valid_but_are_not():
    # Longest match per token: "1e" is 1 then the identifier e, "1.2.3" is 1.2 then .3; either
    # way the parse ends there and the rest, valid or not, is never looked at.
    assert m("a = 1e", a="1")
    assert m("a = 1e AND b = 2", a="1")
    assert m("a = 1.2.3 AND b", a="1.2")
    assert m("a = 1)", a="1")


# --- limits --------------------------------------------------------------------------------------

def test_length_limit():
    ok = "a = '" + "x" * (MAX_EXPRESSION_LENGTH - 6) + "'"
    assert len(ok) == MAX_EXPRESSION_LENGTH
    assert m(ok, a="x" * (MAX_EXPRESSION_LENGTH - 6))
    assert "longer than" in str(rejected(ok + " "))


def test_nesting_limit():
    deepest = MAX_NESTING - 1  # the innermost operand is one more level
    assert m("(" * deepest + "a = '1'" + ")" * deepest, a="1")
    assert "nested deeper" in str(rejected("(" * MAX_NESTING + "a = '1'" + ")" * MAX_NESTING))
    assert m("NOT " * deepest + "a", a="x")  # an odd number of NOTs over FALSE
    rejected("NOT " * MAX_NESTING + "a")
    assert compile_selector("NOT " * (deepest - 1) + "(a)")
    rejected("NOT " * deepest + "(a)")  # the parenthesis takes a level too
    rejected("- " * 10_000 + "1 = a")
    rejected("(" * 30_000)


def test_tree_depth_limit():
    # (((a = a) = a) = a) ...: each "=" adds a level; the first comparison is depth 2.
    ok = " = ".join(["a"] * MAX_TREE_DEPTH)
    assert compile_selector(ok)
    assert "deeper than" in str(rejected(ok + " = a"))
    assert "deeper than" in str(rejected("a" + " IS NULL" * MAX_TREE_DEPTH))


def test_long_flat_chains_do_not_recurse():
    terms = [f"a='v{i}'" for i in range(5_000)]
    expr = " OR ".join(terms)
    assert len(expr) < MAX_EXPRESSION_LENGTH
    sel = compile_selector(expr)
    assert sel.matches({"a": "v4999"})
    assert not sel.matches({"a": "v5000"})
    assert compile_selector(" AND ".join(terms[:2] + ["(" + " AND ".join(terms[2:50]) + ")"]))


def test_nested_same_operator_chains_are_flattened():
    # ((core) OR x0 = '1') OR x1 = '1' ... is one OR node, so only the core counts towards the
    # tree depth; unflattened, the 62 parenthesised ORs would push it past MAX_TREE_DEPTH.
    expr = " = ".join(["a"] * (MAX_TREE_DEPTH - 10))
    for i in range(MAX_NESTING - 2):
        expr = f"({expr}) OR x{i} = '1'"
    sel = compile_selector(expr)
    assert sel.matches({"x5": "1"})
    assert not sel.matches({"x5": "2"})


def test_no_recursion_error_escapes():
    expr = "(" * (MAX_NESTING - 1) + "unique_for_recursion_test = '1'" + ")" * (MAX_NESTING - 1)
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 60)
    try:
        with pytest.raises(SelectorError):
            compile_selector(expr)
    finally:
        sys.setrecursionlimit(limit)
    assert m(expr, unique_for_recursion_test="1")


def test_pathological_lexing_is_fast():
    # Inputs that would make a naive lexer quadratic or backtrack badly; the timeout is the check.
    n = MAX_EXPRESSION_LENGTH - 20
    for expr in ("a = '" + "''" * (n // 2), "/*" + "*" * n, "/*" + " *" * (n // 2), "a = 1 AND b = " + "-" * n,
                 "a = " + "9" * n, "a > " + "1" * n + ".5", "a = '" + "x" * n):
        with pytest.raises(SelectorError):
            compile_selector(expr)
    for expr in ("a = '1' --" + "-" * n, "a = '1' " + "-- x\n" * (n // 5), "a = /*" + "*" * n + "/ '1'"):
        assert m(expr, a="1")


def test_non_string_expression():
    with pytest.raises(SelectorError):
        compile_selector(None)  # type: ignore[arg-type]
    with pytest.raises(SelectorError):
        compile_selector(b"a = '1'")  # type: ignore[arg-type]


# --- the Selector object --------------------------------------------------------------------------

def test_selector_object():
    sel = compile_selector("a = '1'")
    assert isinstance(sel, Selector)
    assert sel.expression == "a = '1'"
    with pytest.raises(dataclasses.FrozenInstanceError):
        sel.expression = "x"  # type: ignore[misc]
    assert "a = '1'" in repr(sel)


def test_matches_never_raises():
    class Broken(dict):
        def get(self, key, default=None):
            raise KeyError(key)

    sel = compile_selector("a = '1' OR TRUE")
    assert sel.matches(None) is True  # no properties: every property is null
    assert compile_selector("a = '1'").matches(Broken(a="1")) is False
    assert compile_selector("a > 1").matches({"a": object()}) is False  # type: ignore[dict-item]


# --- the compile-time shortcuts agree with the generic evaluation ---------------------------------

LITERALS = ["5", "5L", "2147483648", "5.5", "-5", "-5.5", "- -5", "'5'", "'x'", "TRUE", "FALSE", "-NULL", "-'x'"]
VALUES = [None, "5", "6", "4", "5.0", "5.5", "x", "NaN", "-0.0", "true", "+5", " 5", "2147483648", "-5", "", "٥"]


def _outcome(evaluate, props):
    try:
        return evaluate(props)
    except Exception as exc:
        return type(exc).__name__


@pytest.mark.parametrize("op", ["=", "<>", ">", ">=", "<", "<=", "IS NULL", "IS NOT NULL"])
def test_fast_paths_agree_with_generic(op):
    checked = 0
    for lit in LITERALS:
        for expr in ((f"a {op}",) if op.startswith("IS") else (f"a {op} {lit}", f"{lit} {op} a")):
            try:
                fast, slow = _build(_Parser(expr), True), _build(_Parser(expr), False)
            except SelectorError:
                continue
            for value in VALUES:
                props = {} if value is None else {"a": value}
                assert _outcome(fast, props) == _outcome(slow, props), (expr, value)
                checked += 1
    assert checked >= len(VALUES)

