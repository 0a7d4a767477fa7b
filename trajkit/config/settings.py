"""Plugin settings: each plugin class declares a pydantic model, ``Settings``, the one place its
settings' defaults, types and descriptions live. Flags, configuration-file sections, ``KEY=VALUE``
options and the error messages all come from those models through this module.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError


class StrictSettings(BaseModel):
    """Base of every plugin settings model: unknown keys are errors, instances are immutable.

    A docstring under a field is its description (``--help``, ``trajkit settings``, errors),
    read when one of those needs it (:func:`documented`).
    Schemas are built on first use (``defer_build``): a command pays only for the models it
    validates, not for every installed plugin's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class OptionError(ValueError):
    """An option the plugin does not have, or a value it cannot take; the message names both."""


class Configurable:
    """A plugin class with settings of its own (:attr:`Settings`), validated when it is made: the
    base of sandbox backends, filters, writers and executors."""

    Settings: ClassVar[type[StrictSettings]] = StrictSettings

    def __init__(self, settings: StrictSettings | Mapping[str, Any] | None = None) -> None:
        """``settings``: an instance of :attr:`Settings`, or a mapping validated against it
        (a wrong key or value raises :class:`pydantic.ValidationError`)."""
        self.settings = self.Settings.model_validate(settings if settings is not None else {})


def parse_pairs(pairs: tuple[str, ...] | list[str], flag: str) -> dict[str, Any]:
    """``["keep_last=3", "mask.min_chars=0"]`` -> ``{"keep_last": "3", "mask": {"min_chars": "0"}}``."""
    data: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise OptionError(f"{flag} {pair!r}: expected KEY=VALUE, e.g. keep_last=3")
        *parents, leaf = key.strip().split(".")
        node = data
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise OptionError(f"{flag} {pair!r}: {part} is given both as a value and as a section")
            node = child
        node[leaf] = value
    return data


def documented(model: type[BaseModel]) -> type[BaseModel]:
    """``model`` with each field's description filled from the docstring under the field.

    Read on demand rather than by pydantic's ``use_attribute_docstrings``, which parses every
    class's source when it is defined: milliseconds per settings model at every start, for text
    only ``--help``, ``trajkit settings`` and error messages show.
    """
    if model not in _DOCUMENTED:
        docs: dict[str, str] = {}
        for cls in reversed(model.__mro__):
            if issubclass(cls, BaseModel) and cls is not BaseModel:
                docs.update(_attribute_docstrings(cls))
        for name, field in model.model_fields.items():
            if field.description is None and name in docs:
                field.description = docs[name]
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                documented(annotation)
        _DOCUMENTED.add(model)
    return model


_DOCUMENTED: set[type[BaseModel]] = set()


def _attribute_docstrings(cls: type) -> dict[str, str]:
    import ast
    import inspect
    import itertools
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


class Metavar(str):
    """How ``--help`` names a setting's values, for a type the annotation alone does not say:
    ``Annotated[int, BeforeValidator(parse_size), Metavar("SIZE")]``."""


Place = str | Callable[[str], str]
"""Where a setting came from, for error messages: a flag such as ``--option`` (then the key is
appended: ``--option keep_last``) or a function from the key to its place."""


def build_settings(model: type[BaseModel], data: Mapping[str, Any], plugin: str, place: Place) -> BaseModel:
    """``model`` from ``data``; a :class:`OptionError` naming the plugin, the key and what it expects."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        where = place if callable(place) else (lambda key: f"{place} {key}")
        raise OptionError(
            "; ".join(_explain(model, data, error, plugin, where) for error in exc.errors())
        ) from None


def _explain(
    model: type[BaseModel], data: Mapping[str, Any], error: Any, plugin: str, where: Callable[[str], str]
) -> str:
    path = [str(part) for part in error["loc"]]
    key = ".".join(path)
    if error["type"] == "extra_forbidden":
        owner = _model_at(model, path[:-1])
        known = ", ".join(sorted(owner.model_fields)) if owner else "none"
        guess = did_you_mean(path[-1], owner.model_fields if owner else ())
        return f"{where(key)}: {plugin} has no setting {key!r} (its settings: {known or 'none'}){guess}"
    if error["type"] == "missing":
        return f"{plugin} needs the setting {key!r} ({describe_field(model, path)})"
    if not path:  # a check across several settings
        return f"{plugin}: {error['msg'].removeprefix('Value error, ')}"
    given = value_at(data, path)
    return f"{where(key)}={given}: {plugin} expects {key} to be {describe_field(model, path)}; {error['msg']}"


def describe_field(model: type[BaseModel], path: list[str]) -> str:
    """The field's type and description, e.g. ``int: the last N turns are never summarised``."""
    owner = _model_at(model, path[:-1])
    field = documented(owner).model_fields.get(path[-1]) if owner and path else None
    if field is None:
        return "a valid value"
    annotation = field_type(field)
    bounds = [
        f"{symbol} {getattr(item, attr)}"
        for item in field.metadata
        for attr, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
        if getattr(item, attr, None) is not None
    ]
    kind = f"{annotation} {' and '.join(bounds)}".strip()
    return f"{kind} ({field.description})" if field.description else kind


def field_type(field: Any) -> str:
    """A setting's type as people read it: its :class:`Metavar`, else its annotation's."""
    named = [item for item in field.metadata if isinstance(item, Metavar)]
    return named[0].lower() if named else type_name(field.annotation)


def unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (it, False)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0], True
    return annotation, False


def type_name(annotation: Any) -> str:
    """``int | None`` -> "int or none", ``Literal["a", "b"]`` -> "one of a, b", ``list[str]`` -> "list of str"."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return " or ".join("none" if a is type(None) else type_name(a) for a in args)
    if origin in (list, tuple, set):
        return f"{origin.__name__} of {', '.join(type_name(a) for a in args if a is not Ellipsis)}"
    if origin is dict:
        return f"table of {type_name(args[0])} to {type_name(args[1])}" if args else "table"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def describe_settings(model: type[BaseModel], prefix: str = "") -> list[str]:
    """One line per setting, nested models flattened to ``section.key``, with defaults."""
    lines = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            lines.extend(describe_settings(annotation, f"{prefix}{name}."))
            continue
        value = "(required)" if field.is_required() else repr(field.get_default(call_default_factory=True))
        lines.append(f"{prefix}{name} = {value}: {describe_field(model, [name])}")
    return lines


def _model_at(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    current: type[BaseModel] | None = model
    for part in path:
        field = current.model_fields.get(part) if current else None
        annotation = field.annotation if field else None
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return current


def value_at(data: Mapping[str, Any], path: list[str]) -> Any:
    node: Any = data
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to a misspelt ``name``, else ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
