"""One validation layer for the servers' JSON bodies: pydantic models, our messages.

``/generate`` (:mod:`~tunix_agentic.serving.generate_request`), the OpenAI endpoints
(:mod:`~tunix_agentic.rollout.openai_endpoint.protocol`) and the rollout
node's wire format (:mod:`~tunix_agentic.rollout.wire`) check a body with a pydantic
model: :class:`Strict` types, ``Field`` bounds, and validators only for what types cannot
say (they raise :func:`invalid`). :func:`validate` runs one and turns pydantic's error into
the caller's error type, in our words and naming the field's path:
``messages[2].tool_calls[0].function.arguments: must be a string holding a JSON object``,
``trajectory.token_ids[1] must be an integer, got True``. The small bodies (the node's
policy, claim and engines, a reward, ``/update_weights_from_disk``, ``serve-env``'s
``POST /envs``) go through :func:`validate_body`. Nothing here imports JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

T = TypeVar("T")
NonEmpty = Annotated[str, Field(min_length=1)]

# What a value must be, by pydantic's error for a value of another type.
_KINDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "none_required": "null",
    "literal_error": "{expected}",
}
# pydantic's other errors in our words ({input}: the value given; the rest, its context).
_WORDS = {
    "missing": "is required",
    "extra_forbidden": "is not a supported field",
    "string_too_short": "must be a non-empty string",
    "too_short": "must not be empty",
    "too_long": "must hold at most {max_length} items, got {actual_length}",
    "greater_than_equal": "must be >= {ge}, got {input}",
    "greater_than": "must be > {gt}, got {input}",
    "less_than_equal": "must be <= {le}, got {input}",
}


class Strict(BaseModel):
    """A JSON object's model: strict types (a bool is no integer, a string no number; an
    integer passes for a float) and no field it does not name (a subclass declared with
    ``extra="ignore"`` lets those pass)."""

    model_config = ConfigDict(strict=True, extra="forbid")


def invalid(message: str, at: str | int | tuple[str | int, ...] = ()) -> PydanticCustomError:
    """The error a validator raises for what types cannot say: ``message`` about the value
    validated or, ``at``, its field (a key, an index or a path of them)."""
    return PydanticCustomError("invalid", message, {"at": at})


def inert(*allowed: Any, why: str) -> Any:
    """The type of a field a client may send only with a value that changes nothing here
    (one of ``allowed``; a bool is no number): another is refused saying ``why``. Used as
    pydantic's ``conint`` is: ``store: inert(False, why="...") = None``."""

    def check(value: Any) -> Any:
        if not any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed):
            raise invalid(f"{why}, got {value!r:.80}")
        return value

    return Annotated[Any, AfterValidator(check)]


def validate(
    model: type[T] | TypeAdapter[T],
    raw: Any,
    *,
    root: str = "",
    sep: str = ": ",
    error: Callable[[str], Exception] = ValueError,
    context: dict[str, Any] | None = None,
) -> T:
    """``raw`` checked by ``model`` (a pydantic model class or a ``TypeAdapter``; ``context``
    reaches its validators), or ``error`` raised with :func:`message`."""
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(raw, context=context)
        return model.model_validate(raw, context=context)  # type: ignore[attr-defined]
    except ValidationError as exc:
        raise error(message(exc, raw, root=root, sep=sep)) from None


def validate_body(
    model: type[T],
    raw: Any,
    *,
    shape: str,
    sep: str = " ",
    error: Callable[[str], Exception] = ValueError,
) -> T:
    """A request's JSON body checked by ``model`` (:func:`validate`: the message names the
    field, ``version must be >= 0, got -1``); a body that is no JSON object is refused as
    ``the body must be a JSON object <shape>`` (``shape``: what one looks like)."""
    if not isinstance(raw, Mapping):
        raise error(f"the body must be a JSON object {shape}")
    return validate(model, raw, sep=sep, error=error)


def message(exc: ValidationError, raw: Any, *, root: str = "", sep: str = ": ") -> str:
    """``<path><sep><what is wrong>`` for the deepest of ``exc``'s errors (where a value may
    take several forms, the one that came closest), the path from ``root`` into ``raw``
    (``messages[2].content``). At that path, a form that took the value's type but not the
    value speaks first; forms that all refused its type are named together (``stop: must be
    a string or a list, got 3``)."""
    found = [(_path(e, raw), e) for e in exc.errors(include_url=False)]
    depth = max(len(path) for path, _ in found)
    path = next(path for path, _ in found if len(path) == depth)
    here = [e for p, e in found if p == path]
    err = next((e for e in here if e["type"] not in _KINDS), here[0])
    ctx, shown = err.get("ctx", {}), f"{err['input']!r:.80}"
    if err["type"] in _KINDS:
        kinds = [_KINDS[e["type"]].format(**e.get("ctx", {})) for e in here]
        what = f"must be {' or '.join(dict.fromkeys(kinds))}, got {shown}"
    elif err["type"] == "invalid":
        what = err["msg"]
    else:
        what = _WORDS.get(err["type"], err["msg"]).format(input=shown, **ctx)
    where = root
    for key in path:
        where += f"[{key}]" if isinstance(key, int) else f".{key}" if where else key
    return f"{where}{sep}{what}" if where else what


def _path(err: ErrorDetails, raw: Any) -> tuple[str | int, ...]:
    """Where ``err`` is in ``raw``: its location less what pydantic adds that ``raw`` does
    not hold (a union member's name), with a missing field's name and :func:`invalid`'s
    ``at``."""
    loc, path, value = err["loc"], [], raw
    for i, key in enumerate(loc):
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list) and isinstance(key, int) and key < len(value):
            value = value[key]
        elif not (err["type"] == "missing" and i == len(loc) - 1):
            continue
        path.append(key)
    at = err.get("ctx", {}).get("at", ())
    return (*path, *(at if isinstance(at, tuple) else (at,)))
