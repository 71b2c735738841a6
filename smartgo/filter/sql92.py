"""RocketMQ 4.x SQL92 message selectors (``MessageSelector.bySql``), evaluated on message properties.

Java/Go/C++ consumers send these expressions to the broker and expect exactly the messages a Java
4.x broker would deliver, so this module reproduces the Java semantics, quirks included, rather
than textbook SQL.  It is written from a reading of apache/rocketmq ``filter/`` (SelectorParser.jj
and the generated SelectorParser.java/SelectorParserTokenManager.java, ComparisonExpression,
UnaryExpression, LogicExpression, ConstantExpression, BooleanConstantExpression, PropertyExpression)
and ``broker/.../filter/ExpressionMessageFilter.java``; no code was copied.

Grammar version: the one shipped unchanged from 4.2.0 to 4.9.x (reserved words NOT AND OR BETWEEN
IN TRUE FALSE NULL IS).  CONTAINS / NOT CONTAINS / STARTSWITH / ENDSWITH are *not* in it: they were
added on the 5.x development line in June 2023 (apache/rocketmq PRs #6864 and #6915), so here those
words are ordinary property names, as on a 4.9 broker.

What the Java code does, and this module therefore does:

* Precedence, loosest first: OR < AND < {=, <>, IS [NOT] NULL} < {>, >=, <, <=, [NOT] BETWEEN,
  [NOT] IN} < unary {NOT, -, +} < literal / property / parenthesis.  Binary levels are loops, so
  left-associative.  NOT is *unary*: ``NOT a = 'x'`` means ``(NOT a) = 'x'``.  No + - * / arithmetic.
* The parser stops after the longest valid prefix; nothing requires end of input (JmsSelector()
  has no <EOF>).  ``a = 1 garbage`` is accepted as ``a = 1``, and since hex/octal literals were
  removed from the grammar, ``a = 0x1F`` lexes as ``0`` then ``x1F`` and means ``a = 0``.  Only the
  one token after the parsed prefix is scanned, so it must still be a valid token.
* Literals: strings in single quotes with '' for a quote; ``0`` or ``[1-9][0-9]*`` with an optional
  L suffix (a Java Integer when it fits 32 bits, else a Long; beyond 64 bits is a parse error);
  floats ``1.5``, ``1.``, ``.5``, ``1e5``, ``1.5E-3`` (Double; infinite, and also *zero*, is a parse
  error: ConstantExpression.createFloat rejects values below Double.MIN_VALUE, so ``0.0`` is
  refused); TRUE, FALSE, NULL; keywords in any case.  Identifiers are ASCII
  ``[A-Za-z_$][A-Za-z0-9_$]*`` and case-sensitive.  Comments ``/* */`` and ``--`` up to a newline.
* Every property is a Java String at the broker.  The parser sets the ComparisonExpression thread
  local CONVERT_STRING_EXPRESSIONS (SelectorParser.parse), so comparisons convert a String to the
  type of the other operand: property vs Integer literal uses Integer.valueOf (strict: optional
  sign and digits only, 32-bit range), vs Long literal Long.valueOf, vs Double literal
  Double.valueOf (trims, accepts 1e3, NaN, Infinity, hex floats, f/d suffix), vs TRUE/FALSE
  Boolean.valueOf (equalsIgnoreCase "true").  A failed conversion throws, and a throw anywhere
  makes the message not match (ExpressionMessageFilter).  So ``a > 5`` matches a="6" but not
  a="6.5" (error), ``a = 6`` matches a="6" and a="+06", ``a <> 6`` does *not* match a="x"
  (error), ``a > 5.0`` matches a="6.5" and a="NaN" (Double.compareTo puts NaN above everything).
  Two properties compared with > >= < <= are both parsed as Double; with = and <> they are
  compared as plain strings.  ``TRUE = a`` always throws (a Boolean is cast to String).
* BETWEEN x AND y is ``>= x AND <= y``; NOT BETWEEN is ``< x OR > y``.  IN lists hold string
  literals only and the left side must be a property; IN compares strings exactly.
* Nulls: a missing property is null.  ``=`` returns null when only the *left* side is null, FALSE
  when only the right side is, TRUE when both are (so ``a = b`` matches when both are missing and
  ``'x' <> a`` matches when ``a`` is missing); > >= < <= and IN return null on any null; AND, OR
  and NOT are three-valued with left-to-right short-circuit; a bare property used as a condition
  is null when missing and FALSE otherwise (it is never a Boolean).  Only TRUE matches.
* Parse-time errors: a string, boolean or NULL operand of > >= < <=, or a boolean expression
  there; NULL as an operand of = or <>; TRUE/FALSE compared with another kind of literal (when
  the boolean is on the left); BETWEEN with NULL bounds or a lower literal bound greater than the
  upper one (checked only when both bounds are plain literals); IN without a property on the
  left; a non-boolean (literal, negation) where a condition is needed; lexical and syntax errors;
  empty input.  This module adds two limits Java lacks: expression length and nesting depth.
"""

from __future__ import annotations

import math
import operator
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_EXPRESSION_LENGTH", "MAX_NESTING", "MAX_TREE_DEPTH", "Selector", "SelectorError",
           "compile_selector"]

MAX_EXPRESSION_LENGTH = 64 * 1024
"""Longest accepted expression, in characters (Java has no limit; this bounds parse time and memory)."""
MAX_NESTING = 64
"""Deepest nesting of parentheses and unary operators (NOT, -, +): bounds the parser's recursion."""
MAX_TREE_DEPTH = 128
"""Deepest expression tree (AND/OR chains are flattened): bounds compile and evaluation recursion."""


class SelectorError(ValueError):
    """An expression a Java 4.x broker would reject; ``position`` is the 0-based offset, if known."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class _EvalError(Exception):
    """A Java exception during evaluation (bad number, ClassCastException): the message does not match."""


# ---------------------------------------------------------------------------------------------
# Java value model.  Runtime values: None (null), str (String), bool (Boolean), int (Integer),
# _Long (Long), float (Double).  Byte/Short/Float never arise from this grammar or from properties.
# ---------------------------------------------------------------------------------------------

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


class _Long(int):
    """A Java Long; a plain int is a Java Integer.  The difference decides how a String converts."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}L"


def _parse_integral(s: str, lo: int, hi: int) -> int:
    """Java Integer.valueOf / Long.valueOf: optional sign, one or more decimal digits, in range."""
    sign = s[:1]
    digits = s[1:] if sign == "+" or sign == "-" else s
    if not digits.isdecimal():  # Unicode Nd, like Character.digit(c, 10); False for ""
        raise _EvalError(f"NumberFormatException: For input string: {s!r}")
    if not digits.isascii():
        if any(ord(ch) > 0xFFFF for ch in digits):  # Java reads UTF-16 units: a surrogate is no digit
            raise _EvalError(f"NumberFormatException: For input string: {s!r}")
        digits = "".join(str(unicodedata.decimal(ch)) for ch in digits)
    digits = digits.lstrip("0") or "0"
    if len(digits) <= 19:
        n = -int(digits) if sign == "-" else int(digits)
        if lo <= n <= hi:
            return n
    raise _EvalError(f"NumberFormatException: For input string: {s!r}")


def _parse_int(s: str) -> int:
    return _parse_integral(s, _INT_MIN, _INT_MAX)


def _parse_long(s: str) -> _Long:
    return _Long(_parse_integral(s, _LONG_MIN, _LONG_MAX))


_JAVA_TRIM = "".join(map(chr, range(0x21)))  # String.trim() strips every char <= U+0020
_JAVA_DOUBLE_RE = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<nan>NaN)|(?P<inf>Infinity)"
    r"|(?P<dec>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?)")


def _parse_double(s: str) -> float:
    """Java Double.valueOf(String): the grammar of its Javadoc, ASCII digits, trimmed."""
    m = _JAVA_DOUBLE_RE.fullmatch(s.strip(_JAVA_TRIM))
    if m is None:
        raise _EvalError(f"NumberFormatException: For input string: {s!r}")
    if m["nan"]:
        return math.nan
    if m["inf"]:
        return -math.inf if m["sign"] == "-" else math.inf
    if m["dec"]:
        return float(m["sign"] + m["dec"])
    return float.fromhex(m["sign"] + m["hex"])


def _parse_bool(s: str) -> bool:
    """Java Boolean.valueOf(String): "true" ignoring ASCII case, anything else is false."""
    return len(s) == 4 and s.lower() == "true"


def _dcmp(a: float, b: float) -> int:
    """Java Double.compareTo: a total order with -0.0 < 0.0 and NaN above +Infinity, NaN == NaN."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a == 0.0:
            sa, sb = math.copysign(1.0, a), math.copysign(1.0, b)
            return (sa > sb) - (sa < sb)
        return 0
    a_nan, b_nan = a != a, b != b
    return a_nan - b_nan


def _compare(lv: Any, rv: Any) -> int:
    """ComparisonExpression.__compare with string conversion on; both values are non-null.

    Mixed types are converted towards the other operand's type; a type pair it does not know
    compares as "less" (-1).  A Boolean on the left of a String throws ClassCastException in
    Java (it casts the Boolean to String), reproduced as an evaluation error.
    """
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is bool:
            if rt is str:
                raise _EvalError("ClassCastException: Boolean cannot be cast to String")
            return -1
        if lt is int or lt is _Long:
            if rt is int or rt is _Long:
                pass
            elif rt is float:
                lv = float(lv)
            elif rt is str:
                rv = _parse_int(rv) if lt is int else _parse_long(rv)
            else:
                return -1
        elif lt is float:
            if rt is int or rt is _Long:
                rv = float(rv)
            elif rt is str:
                rv = _parse_double(rv)
            else:
                return -1
        elif lt is str:
            if rt is bool:
                lv = _parse_bool(lv)
            elif rt is int:
                lv = _parse_int(lv)
            elif rt is _Long:
                lv = _parse_long(lv)
            elif rt is float:
                lv = _parse_double(lv)
            else:
                return -1
        else:
            return -1
    if type(lv) is float:
        return _dcmp(lv, rv)
    # int/Long, Boolean (false < true) and String.  Java orders Strings by UTF-16 unit, Python by
    # code point; only "== 0" of two Strings is ever observable (ordering two Strings goes through
    # Double), so the difference cannot show.
    try:
        return (lv > rv) - (lv < rv)
    except TypeError as exc:  # only with property values outside the str contract
        raise _EvalError(str(exc)) from None


def _negate(v: Any) -> Any:
    """UnaryExpression.createNegate: numbers keep their Java type (with its overflow), else null."""
    t = type(v)
    if t is int:
        return ((-v - _INT_MIN) & 0xFFFFFFFF) + _INT_MIN
    if t is _Long:
        return _Long(((-v - _LONG_MIN) & 0xFFFFFFFFFFFFFFFF) + _LONG_MIN)
    if t is float:
        return -v
    return None


# ---------------------------------------------------------------------------------------------
# Lexer: JavaCC longest match, keywords beating identifiers of the same length; tokens are read
# lazily, exactly as far as the parser looks, because Java never scans past that either.
# ---------------------------------------------------------------------------------------------

_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
_ID_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_DECIMAL_RE = re.compile(r"0|[1-9][0-9]*[lL]?")
_FLOAT_RE = re.compile(r"(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+")
_STRING_RE = re.compile(r"'(?:''|[^'])*'")
_LINE_COMMENT_RE = re.compile(r"--[^\n\r]*(?:\r\n|\r|\n)")
_BLOCK_COMMENT_RE = re.compile(r"/\*[^*]*\*+(?:[^/*][^*]*\*+)*/")
_WHITESPACE = frozenset(" \t\n\r\f")
_OPERATORS = ("<>", "<=", ">=", "<", ">", "=", "(", ")", ",", "+", "-")


class _Token:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind, self.text, self.pos = kind, text, pos

    def describe(self) -> str:
        return "end of input" if self.kind == "EOF" else repr(_clip(self.text))


def _clip(text: str, limit: int = 40) -> str:
    """Keeps error messages short when a token or literal is huge."""
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------------------------
# Syntax tree.  The classes mirror the Java ones only as far as the parse-time checks need
# (is it a constant, a property, a boolean expression?); ``depth`` bounds later recursion.
# ---------------------------------------------------------------------------------------------

class _Node:
    __slots__ = ("depth",)
    depth: int
    is_boolean = False


class _Const(_Node):
    """ConstantExpression; TRUE, FALSE and NULL are BooleanConstantExpressions (also boolean)."""

    __slots__ = ("value", "is_boolean")

    def __init__(self, value: Any) -> None:
        self.value, self.depth = value, 1
        self.is_boolean = value is None or type(value) is bool


class _Prop(_Node):
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name, self.depth = name, 1


class _Neg(_Node):
    __slots__ = ("child",)

    def __init__(self, child: _Node) -> None:
        self.child, self.depth = child, child.depth + 1


class _Not(_Node):
    __slots__ = ("child",)
    is_boolean = True

    def __init__(self, child: _Node) -> None:
        self.child, self.depth = child, child.depth + 1


class _BoolCast(_Node):
    """A property used as a condition: null when missing, else FALSE (a String is no Boolean)."""

    __slots__ = ("prop",)
    is_boolean = True

    def __init__(self, prop: _Prop) -> None:
        self.prop, self.depth = prop, 2


class _Logic(_Node):
    """AND / OR over two or more operands; Java's left-deep binary chains flattened (same results)."""

    __slots__ = ("op", "children")
    is_boolean = True

    def __init__(self, op: str, children: tuple[_Node, ...]) -> None:
        self.op, self.children = op, children
        self.depth = 1 + max(c.depth for c in children)


class _Eq(_Node):
    """ComparisonExpression.doCreateEqual; IS NULL is an _Eq with a NULL constant on the right."""

    __slots__ = ("left", "right")
    is_boolean = True

    def __init__(self, left: _Node, right: _Node) -> None:
        self.left, self.right = left, right
        self.depth = 1 + max(left.depth, right.depth)


class _Order(_Node):
    __slots__ = ("op", "left", "right")
    is_boolean = True

    def __init__(self, op: str, left: _Node, right: _Node) -> None:
        self.op, self.left, self.right = op, left, right
        self.depth = 1 + max(left.depth, right.depth)


class _In(_Node):
    __slots__ = ("prop", "values", "negated")
    is_boolean = True

    def __init__(self, prop: _Prop, values: frozenset[str], negated: bool) -> None:
        self.prop, self.values, self.negated, self.depth = prop, values, negated, 2


_NULL = _Const(None)


def _show(node: _Node) -> str:
    """A short rendering of a node for error messages."""
    if isinstance(node, _Const):
        v = node.value
        if v is None or type(v) is bool:
            return {None: "NULL", True: "TRUE", False: "FALSE"}[v]
        if type(v) is str:
            return "'" + _clip(v.replace("'", "''")) + "'"
        return repr(v) if type(v) is _Long else str(v)
    if isinstance(node, _Prop):
        return node.name
    return "a boolean expression" if node.is_boolean else "an expression"


# ---------------------------------------------------------------------------------------------
# Parser: the .jj grammar's recursive descent, with its one-token (two after NOT / IS) lookahead
# and the node factories' checks, which Java runs while parsing.
# ---------------------------------------------------------------------------------------------

class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.buffer: list[_Token] = []
        self.nesting = 0
        # A "--" comment needs a newline after it; past the last one, "-" is always a token.
        self.last_newline = max(text.rfind("\n"), text.rfind("\r"))

    # -- errors -------------------------------------------------------------------------------

    def error(self, message: str, pos: int | None) -> SelectorError:
        if pos is None:
            return SelectorError(f"Invalid MessageSelector: {message}")
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return SelectorError(f"Invalid MessageSelector: {message} at line {line}, column {column}", pos)

    # -- tokens -------------------------------------------------------------------------------

    def scan(self) -> _Token:
        text, n, pos = self.text, len(self.text), self.pos
        while True:
            if pos >= n:
                self.pos = pos
                return _Token("EOF", "", pos)
            c = text[pos]
            if c in _WHITESPACE:
                pos += 1
            elif c == "-" and pos < self.last_newline and text.startswith("--", pos):
                m = _LINE_COMMENT_RE.match(text, pos)
                if m is None:
                    break
                pos = m.end()
            elif c == "/":
                m = _BLOCK_COMMENT_RE.match(text, pos)
                if m is None:
                    raise self.error("lexical error: '/' does not start a complete /* comment */", pos)
                pos = m.end()
            else:
                break
        c = text[pos]
        if c.isascii() and (c.isalpha() or c == "_" or c == "$"):
            word = _ID_RE.match(text, pos).group()  # type: ignore[union-attr]  # matches: c starts an identifier
            upper = word.upper()
            tok = _Token(upper if upper in _KEYWORDS else "ID", word, pos)
        elif "0" <= c <= "9" or c == ".":
            d = _DECIMAL_RE.match(text, pos)
            f = _FLOAT_RE.match(text, pos)
            dl = d.end() - pos if d else 0
            fl = f.end() - pos if f else 0
            if dl == 0 and fl == 0:
                raise self.error("lexical error: '.' must be followed by a digit", pos)
            tok = (_Token("DECIMAL", d.group(), pos) if dl >= fl  # type: ignore[union-attr]  # d matched: dl > 0
                   else _Token("FLOAT", f.group(), pos))  # type: ignore[union-attr]  # f matched: fl > dl
        elif c == "'":
            m = _STRING_RE.match(text, pos)
            if m is None:
                raise self.error("lexical error: unterminated string literal", pos)
            tok = _Token("STRING", m.group(), pos)
        else:
            for op in _OPERATORS:
                if text.startswith(op, pos):
                    tok = _Token(op, op, pos)
                    break
            else:
                raise self.error(f"lexical error: unexpected character {c!r}", pos)
        self.pos = pos + len(tok.text)
        return tok

    def peek(self, k: int = 1) -> _Token:
        while len(self.buffer) < k:
            self.buffer.append(self.scan())
        return self.buffer[k - 1]

    def take(self) -> _Token:
        tok = self.peek()
        del self.buffer[0]
        return tok

    def expect(self, kind: str) -> _Token:
        tok = self.peek()
        if tok.kind != kind:
            raise self.error(f"expected {kind} but found {tok.describe()}", tok.pos)
        return self.take()

    # -- grammar ------------------------------------------------------------------------------

    def parse(self) -> _Node:
        first = self.peek()
        node = self.as_boolean(self.or_expr(), first)
        # No end-of-input check: the Java grammar has none, so whatever follows is ignored.
        return node

    def or_expr(self) -> _Node:
        return self.chain("OR", self.and_expr)

    def and_expr(self) -> _Node:
        return self.chain("AND", self.equality)

    def chain(self, op: str, operand: Callable[[], _Node]) -> _Node:
        """operand (op operand)*, flattened into one logic node."""
        first = self.peek()
        left = operand()
        if self.peek().kind != op:
            return left
        operands = self.extend([], op, self.as_boolean(left, first))
        while self.peek().kind == op:
            tok = self.take()
            self.extend(operands, op, self.as_boolean(operand(), tok))
        return self.logic(op, operands, first)

    def equality(self) -> _Node:
        left = self.comparison()
        while True:
            tok = self.peek()
            if tok.kind == "=" or tok.kind == "<>":
                self.take()
                right = self.comparison()
                left = self.make_equal(left, right, tok)
                if tok.kind == "<>":
                    left = self.bounded(_Not(left), tok)
            elif tok.kind == "IS":
                if self.peek(2).kind == "NULL":
                    self.take()
                    self.take()
                    left = self.bounded(_Eq(left, _NULL), tok)
                else:
                    self.take()
                    self.expect("NOT")
                    self.expect("NULL")
                    left = self.bounded(_Not(self.bounded(_Eq(left, _NULL), tok)), tok)
            else:
                return left

    def comparison(self) -> _Node:
        left = self.unary()
        while True:
            tok = self.peek()
            kind = tok.kind
            if kind in (">", ">=", "<", "<="):
                self.take()
                left = self.make_order(kind, left, self.unary(), tok)
            elif kind == "BETWEEN":
                self.take()
                left = self.between(left, tok, negated=False)
            elif kind == "IN":
                self.take()
                left = self.in_list(left, tok, negated=False)
            elif kind == "NOT":
                after = self.peek(2)
                if after.kind == "BETWEEN":
                    self.take()
                    self.take()
                    left = self.between(left, tok, negated=True)
                elif after.kind == "IN":
                    self.take()
                    self.take()
                    left = self.in_list(left, tok, negated=True)
                else:
                    raise self.error(f"expected BETWEEN or IN after NOT but found {after.describe()}", after.pos)
            else:
                return left

    def unary(self) -> _Node:
        tok = self.peek()
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"parentheses and unary operators nested deeper than {MAX_NESTING}", tok.pos)
        try:
            if tok.kind == "+":  # unary plus is dropped: "+x" is the very same node as "x"
                self.take()
                return self.unary()
            if tok.kind == "-":
                self.take()
                return self.bounded(_Neg(self.unary()), tok)
            if tok.kind == "NOT":
                self.take()
                operand = self.peek()
                return self.bounded(_Not(self.as_boolean(self.unary(), operand)), tok)
            return self.primary()
        finally:
            self.nesting -= 1

    def primary(self) -> _Node:
        tok = self.peek()
        kind = tok.kind
        if kind == "ID":
            self.take()
            return _Prop(tok.text)
        if kind == "(":
            self.take()
            node = self.or_expr()
            self.expect(")")
            return node
        if kind == "STRING":
            self.take()
            return _Const(tok.text[1:-1].replace("''", "'"))
        if kind == "DECIMAL":
            self.take()
            digits = tok.text.rstrip("lL")  # no leading zeros: only "0" itself starts with 0
            value = int(digits) if len(digits) <= 19 else _LONG_MAX + 1
            if value > _LONG_MAX:
                raise self.error(f"integer literal {_clip(tok.text)} does not fit a Java long", tok.pos)
            return _Const(value if value <= _INT_MAX else _Long(value))
        if kind == "FLOAT":
            self.take()
            double = float(tok.text)
            if double == math.inf:
                raise self.error(f"{_clip(tok.text)} is greater than Double.MAX_VALUE", tok.pos)
            if double == 0.0:  # createFloat rejects anything below Double.MIN_VALUE, zero included
                raise self.error(f"{_clip(tok.text)} is less than Double.MIN_VALUE (4.9E-324)", tok.pos)
            return _Const(double)
        if kind in ("TRUE", "FALSE", "NULL"):
            self.take()
            return _Const({"TRUE": True, "FALSE": False, "NULL": None}[kind])
        raise self.error(f"unexpected {tok.describe()}", tok.pos)

    # -- node factories, with the checks Java makes while building ------------------------------

    def bounded(self, node: _Node, tok: _Token) -> _Node:
        if node.depth > MAX_TREE_DEPTH:
            raise self.error(f"expression tree deeper than {MAX_TREE_DEPTH}", tok.pos)
        return node

    def as_boolean(self, node: _Node, tok: _Token) -> _Node:
        if node.is_boolean:
            return node
        if isinstance(node, _Prop):
            return _BoolCast(node)
        raise self.error(f"expression will not result in a boolean value: {_show(node)}", tok.pos)

    @staticmethod
    def extend(operands: list[_Node], op: str, node: _Node) -> list[_Node]:
        if isinstance(node, _Logic) and node.op == op:
            operands.extend(node.children)
        else:
            operands.append(node)
        return operands

    def logic(self, op: str, operands: list[_Node], tok: _Token) -> _Node:
        return self.bounded(_Logic(op, tuple(operands)), tok)

    def check_orderable(self, node: _Node, tok: _Token) -> None:
        """checkLessThanOperand: only numeric literals and non-boolean expressions may be ordered."""
        if isinstance(node, _Const):
            if type(node.value) in (int, _Long, float):
                return
            raise self.error(f"value {_show(node)} cannot be compared with {tok.text}", tok.pos)
        if node.is_boolean:
            raise self.error(f"value {_show(node)} cannot be compared with {tok.text}", tok.pos)

    def make_order(self, op: str, left: _Node, right: _Node, tok: _Token) -> _Node:
        self.check_orderable(left, tok)
        self.check_orderable(right, tok)
        return self.bounded(_Order(op, left, right), tok)

    def make_equal(self, left: _Node, right: _Node, tok: _Token) -> _Node:
        for side in (left, right):  # checkEqualOperand: no NULL literal
            if isinstance(side, _Const) and side.value is None:
                raise self.error(f"NULL cannot be compared with {tok.text} (use IS NULL)", tok.pos)
        if (isinstance(left, _Const) and isinstance(right, _Const)
                and left.is_boolean and not right.is_boolean):  # checkEqualOperandCompatability
            raise self.error(f"{_show(left)} cannot be compared with {_show(right)}", tok.pos)
        return self.bounded(_Eq(left, right), tok)

    def between(self, value: _Node, tok: _Token, negated: bool) -> _Node:
        low = self.unary()
        self.expect("AND")
        high = self.unary()
        if negated:  # createNotBetween: no bound check
            return self.logic("OR", [self.make_order("<", value, low, tok),
                                     self.make_order(">", value, high, tok)], tok)
        if isinstance(low, _Const) and isinstance(high, _Const):
            if low.value is None or high.value is None:
                raise self.error("illegal values of BETWEEN: bounds cannot be NULL", tok.pos)
            try:
                order = _compare(high.value, low.value)
            except _EvalError as exc:
                raise self.error(f"illegal values of BETWEEN: {exc}", tok.pos) from None
            if order < 0:
                raise self.error(f"illegal values of BETWEEN: lower bound {_show(low)} is greater than "
                                 f"upper bound {_show(high)}", tok.pos)
        return self.logic("AND", [self.make_order(">=", value, low, tok),
                                  self.make_order("<=", value, high, tok)], tok)

    def in_list(self, left: _Node, tok: _Token, negated: bool) -> _Node:
        self.expect("(")
        values = [self.string_literal()]
        while self.peek().kind == ",":
            self.take()
            values.append(self.string_literal())
        self.expect(")")
        if not isinstance(left, _Prop):
            raise self.error(f"expected a property on the left of IN, got {_show(left)}", tok.pos)
        return _In(left, frozenset(values), negated)

    def string_literal(self) -> str:
        tok = self.peek()
        if tok.kind != "STRING":
            raise self.error(f"IN lists hold string literals only, found {tok.describe()}", tok.pos)
        self.take()
        return tok.text[1:-1].replace("''", "'")


# ---------------------------------------------------------------------------------------------
# Compiler: the tree becomes nested closures over the property mapping.  Comparisons of a
# property with a literal, the common case, get closures with the conversion chosen up front;
# everything else takes the generic route, which follows the Java code step by step.
# ---------------------------------------------------------------------------------------------

Evaluator = Callable[[Mapping[str, str]], Any]
_ORDER_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_NO_VALUE = object()


def _fold(node: _Node) -> Any:
    """The value of a literal or of negated literals, known at compile time; else _NO_VALUE."""
    if isinstance(node, _Const):
        return node.value
    if isinstance(node, _Neg):
        inner = _fold(node.child)
        return _NO_VALUE if inner is _NO_VALUE else _negate(inner)
    return _NO_VALUE


def _constant(value: Any) -> Evaluator:
    def evaluate(props: Mapping[str, str]) -> Any:
        return value
    return evaluate


def _compile(node: _Node, specialize: bool = True) -> Evaluator:
    folded = _fold(node)
    if folded is not _NO_VALUE:
        return _constant(folded)
    if isinstance(node, _Prop):
        name = node.name

        def prop(props: Mapping[str, str]) -> Any:
            return props.get(name)
        return prop
    if isinstance(node, _Neg):
        child = _compile(node.child, specialize)

        def neg(props: Mapping[str, str]) -> Any:
            return _negate(child(props))
        return neg
    if isinstance(node, _Not):
        child = _compile(node.child, specialize)

        def not_(props: Mapping[str, str]) -> Any:
            v = child(props)
            return None if v is None else not v
        return not_
    if isinstance(node, _BoolCast):
        name = node.prop.name

        def bool_cast(props: Mapping[str, str]) -> Any:
            v = props.get(name)
            if v is None:
                return None
            return v if type(v) is bool else False
        return bool_cast
    if isinstance(node, _Logic):
        return _compile_logic(node, specialize)
    if isinstance(node, _In):
        name, values, negated = node.prop.name, node.values, node.negated

        def in_(props: Mapping[str, str]) -> Any:
            v = props.get(name)
            if type(v) is not str:  # null, or a non-String value: UnaryExpression returns null
                return None
            return (v in values) is not negated
        return in_
    if isinstance(node, _Eq):
        return (specialize and _compile_eq_fast(node)) or _compile_eq(node, specialize)
    if isinstance(node, _Order):
        return (specialize and _compile_order_fast(node)) or _compile_order(node, specialize)
    raise AssertionError(f"unknown node {node!r}")


def _compile_logic(node: _Logic, specialize: bool) -> Evaluator:
    children = tuple(_compile(c, specialize) for c in node.children)
    settles = node.op == "OR"  # the operand value that decides the chain at once: TRUE for OR, FALSE for AND

    def logic(props: Mapping[str, str]) -> Any:
        unknown = False
        for child in children:
            v = child(props)
            if v is settles:
                return settles
            if v is None:
                unknown = True
        return None if unknown else not settles
    return logic


def _compile_eq(node: _Eq, specialize: bool) -> Evaluator:
    left, right = _compile(node.left, specialize), _compile(node.right, specialize)

    def eq(props: Mapping[str, str]) -> Any:
        lv, rv = left(props), right(props)
        if lv is None:
            return True if rv is None else None
        if rv is None:
            return False
        return _compare(lv, rv) == 0
    return eq


def _compile_order(node: _Order, specialize: bool) -> Evaluator:
    left, right, test = _compile(node.left, specialize), _compile(node.right, specialize), _ORDER_OPS[node.op]

    def order(props: Mapping[str, str]) -> Any:
        lv = left(props)
        if lv is None:
            return None
        rv = right(props)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:  # two Strings: both must parse as Double
            return test(_dcmp(_parse_double(lv), _parse_double(rv)), 0)
        return test(_compare(lv, rv), 0)
    return order


# String -> literal-type conversions, by the literal's type (what _compare would pick).
_CONVERTERS: dict[type, Callable[[str], Any]] = {
    str: str, int: _parse_int, _Long: _parse_long, float: _parse_double, bool: _parse_bool}


def _compile_eq_fast(node: _Eq) -> Evaluator | None:
    """``prop = literal`` (also IS NULL) without the generic dispatch; ``literal = prop`` gains
    little over the generic path (its null rule needs both sides), so it takes that."""
    if isinstance(node.left, _Prop):
        c = _fold(node.right)
        if c is _NO_VALUE:
            return None
        name = node.left.name
        if c is None:
            def is_null(props: Mapping[str, str]) -> Any:
                return props.get(name) is None
            return is_null
        conv, numeric_double = _CONVERTERS[type(c)], type(c) is float

        def prop_eq(props: Mapping[str, str]) -> Any:
            v = props.get(name)
            if v is None:
                return None
            if type(v) is not str:
                return _compare(v, c) == 0
            x = conv(v)
            return _dcmp(x, c) == 0 if numeric_double else x == c
        return prop_eq
    return None


def _compile_order_fast(node: _Order) -> Evaluator | None:
    """``prop OP number`` / ``number OP prop`` with the String conversion chosen at compile time."""
    test = _ORDER_OPS[node.op]
    if isinstance(node.left, _Prop):
        c, name, prop_on_left = _fold(node.right), node.left.name, True
    elif isinstance(node.right, _Prop):
        c, name, prop_on_left = _fold(node.left), node.right.name, False
    else:
        return None
    if type(c) not in (int, _Long, float):
        return None  # a folded NULL (e.g. "-NULL"), or a string or boolean under a minus: generic
    conv = _CONVERTERS[type(c)]
    # Ints compare alike in Java and Python; Doubles need Double.compareTo (NaN is the largest).
    cmp = _dcmp if type(c) is float else (lambda x, y: (x > y) - (x < y))
    if prop_on_left:
        def prop_vs_number(props: Mapping[str, str]) -> Any:
            v = props.get(name)
            if v is None:
                return None
            return test(cmp(conv(v), c) if type(v) is str else _compare(v, c), 0)
        return prop_vs_number

    def number_vs_prop(props: Mapping[str, str]) -> Any:
        v = props.get(name)
        if v is None:
            return None
        return test(cmp(c, conv(v)) if type(v) is str else _compare(c, v), 0)
    return number_vs_prop


# ---------------------------------------------------------------------------------------------
# Public interface
# ---------------------------------------------------------------------------------------------

_EMPTY: Mapping[str, str] = {}


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector; build it with compile_selector().  Immutable and thread-safe."""

    expression: str
    _evaluate: Evaluator = field(repr=False, compare=False)

    def matches(self, properties: Mapping[str, str] | None) -> bool:
        """True only when the expression is TRUE for these properties.

        Like ExpressionMessageFilter, null (unknown) and any evaluation error (a property that
        does not convert to a number, ...) mean "not matched"; this never raises.
        """
        try:
            return self._evaluate(_EMPTY if properties is None else properties) is True
        except Exception:
            return False


def compile_selector(expression: str) -> Selector:
    """Parse and compile a SQL92 selector; SelectorError for anything a Java 4.x broker rejects.

    Nothing is cached here (Java's SelectorParser keeps 100): a compiled selector takes about 30
    times its text in memory, so a caller that evaluates one expression repeatedly keeps the
    Selector itself, within a budget of its own (the broker's message_filter.Filters).
    """
    if not isinstance(expression, str):
        raise SelectorError(f"Invalid MessageSelector: expected a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise SelectorError(f"Invalid MessageSelector: longer than {MAX_EXPRESSION_LENGTH} characters "
                            f"({len(expression)})")
    return Selector(expression, _build(_Parser(expression)))


def _build(parser: _Parser, specialize: bool = True) -> Evaluator:
    try:
        return _compile(parser.parse(), specialize)
    except RecursionError:  # the depth limits should make this unreachable; never let it escape
        raise SelectorError("Invalid MessageSelector: expression nested too deeply") from None
