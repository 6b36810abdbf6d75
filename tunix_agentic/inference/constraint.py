"""Constrained decoding: which tokens a request may sample next, from a grammar.

A :class:`Constraint` says what a request's output must match (SGLang's names: a JSON
schema, any JSON object, an EBNF grammar, a regular expression, or an xgrammar structural
tag); it travels in :class:`~tunix_agentic.inference.params.SamplingParams`, so every
engine wrapper passes it on, and over HTTP as SGLang's own ``sampling_params`` fields.

The JAX engine enforces it with xgrammar (a maintained structured-generation library, the
one SGLang and vLLM use): a :class:`GrammarBook` compiles a constraint for one
vocabulary (cached), and each constrained request holds a matcher that fills the
bitmask of allowed tokens before each step and accepts the token sampled. The device
sets every other logit to -inf before sampling, so the logprob recorded is that of the
distribution actually sampled (the masked one). A constrained request decodes one token
per device call (the mask of step t+1 depends on the token of step t); unconstrained
requests beside it are unaffected but share that pace while it runs.

xgrammar is optional (``pip install -e .[constrained]``); without it, or without the
model's tokenizer, a constrained request is a ValueError that says so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

#: SGLang's ``sampling_params`` fields, in the order they are looked for.
KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
_CACHE = 64  # compiled grammars kept per book

# What a constraint may hold: xgrammar's compile time grows about with the cube of a schema's
# properties (1,200 optional ones took 11-13 s), so a client's schema is bounded before any
# compile, and compiles run off the event loop within COMPILE_DEADLINE_S.
MAX_CONSTRAINT_CHARS = 16 << 10  # the schema, grammar, pattern or tag as text
MAX_SCHEMA_PROPERTIES = 512  # properties in all of a schema's objects together
MAX_ENUM_VALUES = 1024  # enum and const values in all of a schema
MAX_PATTERN_CHARS = 1000  # one "pattern" (or a regex constraint)
COMPILE_DEADLINE_S = 10.0


@dataclasses.dataclass(frozen=True)
class Constraint:
    """What a request's output must match: ``kind`` one of :data:`KINDS`, ``value`` the
    schema (JSON text), pattern, grammar or structural tag (JSON text)."""

    kind: str
    value: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind must be one of {KINDS}, got {self.kind!r:.40}")
        if not isinstance(self.value, str) or not self.value:
            raise ValueError(f"{self.kind} must be a non-empty string")
        if len(self.value) > MAX_CONSTRAINT_CHARS:
            raise ValueError(
                f"{self.kind}: {len(self.value)} characters, over the limit of "
                f"{MAX_CONSTRAINT_CHARS}"
            )
        if self.kind == "regex" and len(self.value) > MAX_PATTERN_CHARS:
            raise ValueError(
                f"regex: {len(self.value)} characters, over the limit of {MAX_PATTERN_CHARS}"
            )
        if self.kind in ("json_schema", "structural_tag"):
            try:
                parsed = json.loads(self.value)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"{self.kind} is not JSON: {exc}") from None
            _check_schema_size(self.kind, parsed)

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls("json_schema", '{"type": "object"}')

    def to_sglang(self) -> dict[str, str]:
        """The ``sampling_params`` field SGLang reads it from."""
        return {self.kind: self.value}

    @classmethod
    def from_sglang(cls, raw: dict[str, Any]) -> Constraint | None:
        """The constraint of SGLang ``sampling_params`` (None without one); ValueError
        naming the field for a bad value or for more than one."""
        given = [k for k in KINDS if raw.get(k) is not None]
        if len(given) > 1:
            raise ValueError(f"sampling_params: at most one of {given} may be set")
        if not given:
            return None
        value = raw[given[0]]
        if isinstance(value, dict) and given[0] in ("json_schema", "structural_tag"):
            value = json.dumps(value)
        if not isinstance(value, str):
            raise ValueError(f"{given[0]} must be a string, got {type(value).__name__}")
        return cls(given[0], value)


def _check_schema_size(kind: str, schema: Any) -> None:
    """ValueError naming the limit when ``schema`` (a JSON schema, or a structural tag with
    schemas inside) holds more properties or enum values than a compile may take, or a
    longer pattern."""
    properties = values = 0
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in ("properties", "patternProperties") and isinstance(value, dict):
                properties += len(value)
            elif key == "enum" and isinstance(value, list):
                values += len(value)
            elif key == "const":
                values += 1
            elif key == "pattern" and isinstance(value, str) and len(value) > MAX_PATTERN_CHARS:
                raise ValueError(
                    f"{kind}: a pattern of {len(value)} characters, over the limit of "
                    f"{MAX_PATTERN_CHARS}"
                )
            if isinstance(value, dict | list):
                stack.append(value)
    if properties > MAX_SCHEMA_PROPERTIES:
        raise ValueError(
            f"{kind}: {properties} properties, over the limit of {MAX_SCHEMA_PROPERTIES}"
        )
    if values > MAX_ENUM_VALUES:
        raise ValueError(f"{kind}: {values} enum values, over the limit of {MAX_ENUM_VALUES}")


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError(
            "constrained decoding needs xgrammar: pip install -e '.[constrained]'"
        ) from None
    return xgrammar


class Matcher:
    """One request's grammar state (host side): :meth:`fill` the allowed tokens of the next
    step into a bitmask row, :meth:`accept` the token sampled."""

    def __init__(self, matcher: Any):
        self._m = matcher

    def fill(self, row: np.ndarray) -> None:
        """Write the next step's allowed tokens into ``row`` (int32 [ceil(V / 32)]) as bits."""
        self._m.fill_next_token_bitmask(row[None, :])

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False when the grammar does not allow it."""
        return bool(self._m.accept_token(int(token)))

    def terminated(self) -> bool:
        """Whether the grammar is complete and its stop token was accepted."""
        return bool(self._m.is_terminated())


class GrammarBook:
    """Constraints compiled for one tokenizer's vocabulary (xgrammar), the last
    :data:`_CACHE` kept; the vocabulary is read when the first one is compiled.

    ``tokenizer``: the built-in character tokenizer (its token strings) or a Hugging Face
    one (our ``HFTokenizer`` or a ``tokenizers.Tokenizer``, read through transformers);
    ``vocab_size``: the model's (ids past the tokenizer's vocabulary are never allowed);
    ``stop_ids``: the tokens that end a reply once the grammar is complete (default the
    tokenizer's). Thread-safe (the engine's scheduler thread and the caller's may both
    use it)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: tuple[int, ...] | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        if stop_ids is None:
            stop_ids = tuple(getattr(tokenizer, "stop_ids", ()))
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self._compiler: Any = None
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: dict[Constraint, concurrent.futures.Future] = {}

    def _info(self) -> Any:
        """xgrammar's view of the vocabulary."""
        xgr, tokenizer, stops = _xgrammar(), self.tokenizer, list(self.stop_ids)
        rust = getattr(tokenizer, "_tok", None)
        if rust is None and type(tokenizer).__module__.startswith("tokenizers"):
            rust = tokenizer
        if rust is not None:  # a tokenizers.Tokenizer
            from transformers import PreTrainedTokenizerFast

            fast = PreTrainedTokenizerFast(tokenizer_object=rust)
            return xgr.TokenizerInfo.from_huggingface(
                fast, vocab_size=self.vocab_size, stop_token_ids=stops
            )
        if not hasattr(tokenizer, "tokens"):
            raise ValueError(
                f"constrained decoding cannot read the vocabulary of {type(tokenizer).__name__}"
            )
        tokens = list(tokenizer.tokens)
        tokens += [""] * (self.vocab_size - len(tokens))  # padding ids: never allowed
        # Stop and padding tokens are not text: never inside a string (a stop id there
        # would end the reply); stop tokens stay allowed where the grammar may end.
        for i in {*stops, getattr(tokenizer, "pad_id", -1)} - {-1}:
            tokens[i] = ""
        return xgr.TokenizerInfo(
            tokens, xgr.VocabType.RAW, vocab_size=self.vocab_size, stop_token_ids=stops
        )

    def _compile(self, c: Constraint) -> Any:
        xgr = _xgrammar()
        if c.kind == "json_schema":
            return self._compiler.compile_json_schema(c.value, any_whitespace=False)
        if c.kind == "regex":
            return self._compiler.compile_grammar(xgr.Grammar.from_regex(c.value))
        if c.kind == "ebnf":
            return self._compiler.compile_grammar(c.value)
        return self._compiler.compile_structural_tag(c.value)

    def _cached(self, constraint: Constraint) -> Any:
        """``constraint``'s compiled grammar if cached (now the newest), else None; the
        caller holds the lock."""
        compiled = self._compiled.get(constraint)
        if compiled is not None:
            self._compiled.move_to_end(constraint)
        return compiled

    def _compiled_now(self, constraint: Constraint) -> Any:
        """``constraint`` compiled (cached; blocking: the compile may take seconds).
        ValueError when it does not compile."""
        with self._lock:
            compiled = self._cached(constraint)
            if compiled is not None:
                return compiled
            if self._compiler is None:
                self._compiler = _xgrammar().GrammarCompiler(self._info(), max_threads=1)
        try:
            compiled = self._compile(constraint)
        except Exception as exc:  # xgrammar's own errors: a bad schema or grammar
            raise ValueError(f"{constraint.kind} does not compile: {exc}") from None
        with self._lock:
            self._compiled[constraint] = compiled
            while len(self._compiled) > _CACHE:
                self._compiled.popitem(last=False)
        return compiled

    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher for ``constraint`` (compiled here if not cached); ValueError
        when it does not compile."""
        return Matcher(_xgrammar().GrammarMatcher(self._compiled_now(constraint)))

    async def matcher_async(
        self, constraint: Constraint, deadline_s: float = COMPILE_DEADLINE_S
    ) -> Matcher:
        """:meth:`matcher` for a caller on an event loop: a grammar not cached is compiled
        in the book's worker thread (one at a time; a second request for the same one
        waits for the first compile), so the loop keeps serving. ValueError when it does not
        compile, or not within ``deadline_s`` (the compile goes on, and is cached)."""
        with self._lock:
            compiled = self._cached(constraint)
            if compiled is None:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="grammar-compile"
                    )
                job = self._pending.get(constraint)
                if job is None:
                    job = self._pool.submit(self._compiled_now, constraint)
                    self._pending[constraint] = job
                    job.add_done_callback(lambda _, c=constraint: self._pending.pop(c, None))
        if compiled is None:
            try:
                # Shielded: one caller's deadline must not cancel a compile others wait for.
                waited = asyncio.shield(asyncio.wrap_future(job))
                compiled = await asyncio.wait_for(waited, deadline_s)
            except TimeoutError:
                raise ValueError(
                    f"{constraint.kind} did not compile within {deadline_s:g}s: make it smaller"
                ) from None
        return Matcher(_xgrammar().GrammarMatcher(compiled))

    def full_mask(self, rows: int) -> np.ndarray:
        """``rows`` bitmask rows allowing every token."""
        return np.full((rows, self.words), -1, np.int32)
