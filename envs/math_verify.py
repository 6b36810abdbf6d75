"""A safe math-answer verifier: is the agent's answer equal to the expected one?

Answers such as ``\\boxed{3/4}``, ``$12``, ``0.75``, ``75%``, ``sqrt(2)/2`` or
``1,250`` are normalised, checked against a small whitelist grammar (numbers,
+ - * / ^ **, parentheses, ``sqrt``, ``pi``) with Python's parser, and only then
handed to sympy, whose own parser evaluates what it is given (so nothing
arbitrary ever reaches it). Equal means ``simplify(given - expected) == 0``,
with a relative tolerance for decimals that approximate an exact value.
"""

from __future__ import annotations

import ast
import re

import sympy

MAX_ANSWER_CHARS = 120
MAX_RAW_CHARS = 400
MAX_EXPONENT = 16
MAX_POWERS = 4
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_ALLOWED_NAMES = {"sqrt": sympy.sqrt, "pi": sympy.pi}
_NODES = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Constant,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.Pow,
    ast.USub,
    ast.UAdd,
    ast.Name,
    ast.Load,
    ast.Call,
)


def normalize_answer(text: str) -> str:
    """The bare expression of an answer: ``\\boxed{}`` content, no ``$``, units words,
    thousands separators or trailing period; ``75%`` becomes ``(75)/100``; ``^`` is
    ``**``; ``\\frac{a}{b}`` becomes ``(a)/(b)``."""
    text = str(text).strip()
    if len(text) > MAX_RAW_CHARS:  # before any regex: their cost grows with the text
        raise ValueError(f"answer longer than {MAX_RAW_CHARS} characters")
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    text = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("\\cdot", "*")
    text = text.replace("$", "").replace("\\", "").strip().rstrip(".")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,250 -> 1250
    text = re.sub(r"^[A-Za-z ]*=\s*", "", text)  # "x = 3" -> "3"
    text = re.sub(r"\s*(?:[a-zA-Z][a-zA-Z ]*)$", "", text) if not _ends_in_call(text) else text
    percent = re.fullmatch(r"(.*?)\s*%", text)
    if percent:
        text = f"({percent.group(1)})/100"
    return text.replace("^", "**").strip()


def _ends_in_call(text: str) -> bool:
    return text.endswith(")") or text.endswith("pi")


def parse_answer(text: str) -> sympy.Expr:
    """The sympy value of an answer; ``ValueError`` for anything outside the grammar."""
    expr = normalize_answer(text)
    if not expr:
        raise ValueError("empty answer")
    if len(expr) > MAX_ANSWER_CHARS:
        raise ValueError(f"answer longer than {MAX_ANSWER_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ValueError(f"not a number or expression: {expr!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise ValueError(f"not allowed in an answer: {type(node).__name__}")
        if isinstance(node, ast.Name) and node.id not in _ALLOWED_NAMES:
            raise ValueError(f"unknown name in an answer: {node.id!r}")
        if isinstance(node, ast.Call) and (
            not isinstance(node.func, ast.Name) or node.func.id != "sqrt" or node.keywords
        ):
            raise ValueError("only sqrt(...) may be called in an answer")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float):
            raise ValueError("only numbers are allowed in an answer")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            # Powers are evaluated eagerly: a small exponent, and no power of a power
            # ((9**64)**64 is already a 7,000-digit number), keep every answer cheap.
            exponent = node.right.operand if isinstance(node.right, ast.UnaryOp) else node.right
            if not isinstance(exponent, ast.Constant) or abs(exponent.value) > MAX_EXPONENT:
                raise ValueError(f"an exponent must be a number of at most {MAX_EXPONENT}")
            if any(
                isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node.left)
            ):
                raise ValueError("a power of a power is not allowed in an answer")
    if sum(isinstance(n, ast.Pow) for n in ast.walk(tree)) > MAX_POWERS:
        raise ValueError(f"at most {MAX_POWERS} powers in an answer")
    try:
        return sympy.sympify(expr, locals=dict(_ALLOWED_NAMES), rational=True)
    except (sympy.SympifyError, TypeError, ZeroDivisionError) as exc:
        raise ValueError(f"cannot read {expr!r}: {exc}") from None


def answers_equal(given: str, expected: str, *, rel_tol: float = 1e-6) -> bool:
    """Whether ``given`` equals ``expected`` mathematically (``3/4 == 0.75 == 75%``).

    Compared numerically to 30 digits first (cheap, and a decisive "no" for most wrong
    answers); exact answers must agree to ``1e-20`` relative, an answer written with a
    decimal point to ``rel_tol``; sympy's ``simplify`` settles only what has no numeric
    value. False (never an exception) for an answer that cannot be read.
    """
    try:
        a, b = parse_answer(given), parse_answer(expected)
    except ValueError:
        return False
    try:
        fa, fb = complex(sympy.N(a, 30)), complex(sympy.N(b, 30))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        try:
            return bool(sympy.simplify(a - b) == 0)
        except (TypeError, ValueError, ZeroDivisionError):
            return False
    tol = rel_tol if "." in normalize_answer(given) else 1e-20
    return abs(fa - fb) <= tol * max(1.0, abs(fb))
