"""kubectl's JSONPath templates (`-o jsonpath=...`, and the paths of `-o custom-columns=...`),
the subset `kubectl vigil` prints: pure, on decoded JSON.

No well-kept Python library implements kubectl's dialect (text with `{...}` actions, `range` and
`end`, quoted literals): `jsonpath-ng` is Goessner's, without templates, and the kubernetes client
has none. So this is the dialect's common part, small:

- text outside braces is printed as is; `{"\\n"}` prints a quoted string (Go's escapes);
- a path from the current object (`.a.b`, `@.a`) or the root (`$.a`); fields as `.name`,
  `['name']` or `.a\\.b` (a dot in a name, as in `vigil\\.dev/redrive`); `.*` and `[*]`; `..name`
  (at any depth); indices `[0]`, `[-1]` and slices `[1:3]`, `[::2]`; filters `[?(@.type=="Ready")]`
  with `== != < <= > >=` against a quoted string or a number, or `[?(@.a)]` (the field exists);
- `{range PATH}...{end}`, nested too.

What it does not take (unions `['a','b']`, functions, `{.a .b}` several paths in one action) is
refused with `JsonPathError` naming it. As kubectl prints with its default
`--allow-missing-template-keys=true`, a path that finds nothing (or null) prints nothing; several
results of one action are printed separated by a space; maps and lists as compact JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SUPPORTED = (
    "fields (.a.b, ['a'], .a\\.b), .* and [*], ..name, [N], [start:end:step], "
    '[?(@.x=="v")] with == != < <= > >=, {range PATH}...{end}, {"literal"}'
)


class JsonPathError(ValueError):
    """A template this dialect cannot read; the message says where and what it does take."""


# --- the template as parsed ------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    name: str


@dataclass(frozen=True)
class Wildcard:
    pass


@dataclass(frozen=True)
class Descend:  # ..name: the field at any depth below
    name: str


@dataclass(frozen=True)
class Index:
    start: int | None
    end: int | None = None
    step: int | None = None
    slice: bool = False


@dataclass(frozen=True)
class Filter:
    path: Path
    op: str | None  # None: the path exists
    value: Any = None


@dataclass(frozen=True)
class Path:
    root: bool  # from `$` rather than the current object
    steps: tuple[Field | Wildcard | Descend | Index | Filter, ...]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Range:
    path: Path
    body: tuple[Text | Path | Range, ...]


Node = Text | Path | Range

_NAME = re.compile(r"(?:\\.|[^.\[\]\s{}()=!<>,'\"\\])+")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse(template: str) -> tuple[Node, ...]:
    """The template's parts; JsonPathError when it is not one this dialect reads."""
    nodes: list[Node] = []
    stack: list[tuple[Path, list[Node]]] = []  # the ranges open, each with its body so far
    position = 0
    while position < len(template):
        start = template.find("{", position)
        if start < 0:
            nodes.append(Text(template[position:]))
            break
        if start > position:
            nodes.append(Text(template[position:start]))
        end = _closing(template, start)
        action = template[start + 1 : end].strip()
        position = end + 1
        if action.startswith("range ") or action == "range":
            path = _path(action[len("range") :].strip(), template)
            stack.append((path, nodes))
            nodes = []
        elif action == "end":
            if not stack:
                raise JsonPathError(f"error parsing jsonpath {template}: {{end}} without a {{range}}")
            path, outer = stack.pop()
            outer.append(Range(path, tuple(nodes)))
            nodes = outer
        elif action[:1] == '"':
            nodes.append(Text(_unquote(action, template)))
        else:
            nodes.append(_path(action, template))
    if stack:
        raise JsonPathError(f"error parsing jsonpath {template}: a {{range}} without its {{end}}")
    return tuple(nodes)


def _closing(template: str, start: int) -> int:
    """Where the action opened at `start` closes: the next `}` outside a quoted string."""
    quote = ""
    i = start + 1
    while i < len(template):
        char = template[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "}":
            return i
        elif char == "{":
            break
        i += 1
    raise JsonPathError(f"error parsing jsonpath {template}: unclosed action (a {{ without its }})")


def _unquote(literal: str, template: str) -> str:
    """A double-quoted literal with Go's escapes (\\n, \\t, \\", \\\\, \\uXXXX)."""
    try:
        value = json.loads(literal, strict=False)  # a tab typed as itself is kept, as Go keeps it
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, str):
        raise JsonPathError(f"error parsing jsonpath {template}: {literal} is not a quoted string")
    return value


def _path(text: str, template: str) -> Path:
    if not text:
        raise JsonPathError(f"error parsing jsonpath {template}: an empty action {{}}")
    root = text[0] == "$"
    if text[0] in "$@":
        text = text[1:]
    elif text[0] not in ".[":
        raise JsonPathError(
            f"error parsing jsonpath {template}: unrecognized identifier {text.split()[0]} "
            "(a path starts with '.', '@' or '$')"
        )
    steps, rest = _steps(text, template)
    if rest.strip():
        raise JsonPathError(
            f"error parsing jsonpath {template}: {rest.strip()!r} after the path is not supported by "
            f"kubectl vigil (one path an action); supported: {SUPPORTED}"
        )
    return Path(root, tuple(steps))


def _steps(text: str, template: str) -> tuple[list[Field | Wildcard | Descend | Index | Filter], str]:
    """The steps at the start of `text`, and what follows them."""
    steps: list[Field | Wildcard | Descend | Index | Filter] = []
    i = 0
    while i < len(text):
        if text.startswith("..", i):
            match = _NAME.match(text, i + 2)
            if not match:
                raise JsonPathError(f"error parsing jsonpath {template}: '..' must be followed by a field name")
            steps.append(Descend(_field(match.group())))
            i = match.end()
        elif text[i] == ".":
            if text.startswith(".*", i):
                steps.append(Wildcard())
                i += 2
                continue
            match = _NAME.match(text, i + 1)
            if match:
                steps.append(Field(_field(match.group())))
                i = match.end()
            elif i + 1 == len(text) and not steps:
                i += 1  # `{.}`: the current object itself
            else:
                raise JsonPathError(f"error parsing jsonpath {template}: a field name must follow '.'")
        elif text[i] == "[":
            step, i = _bracket(text, i, template)
            steps.append(step)
        else:
            break
    return steps, text[i:]


def _field(raw: str) -> str:
    return re.sub(r"\\(.)", r"\1", raw)


def _bracket(text: str, i: int, template: str) -> tuple[Field | Wildcard | Index | Filter, int]:
    end = _bracket_end(text, i, template)
    inner = text[i + 1 : end].strip()
    after = end + 1
    if inner == "*":
        return Wildcard(), after
    if inner[:1] in "'\"" and len(inner) >= 2 and inner[-1] == inner[0] and inner.count(inner[0]) == 2:
        return Field(inner[1:-1]), after
    if inner.startswith("?(") and inner.endswith(")"):
        return _filter(inner[2:-1].strip(), template), after
    if re.fullmatch(r"-?\d+", inner):
        return Index(int(inner)), after
    if re.fullmatch(r"(-?\d+)?:(-?\d+)?(:(-?\d+)?)?", inner):
        parts = [int(p) if p else None for p in inner.split(":")]
        if len(parts) == 3 and parts[2] == 0:
            raise JsonPathError(f"error parsing jsonpath {template}: a slice's step must not be 0")
        return Index(parts[0], parts[1], parts[2] if len(parts) == 3 else None, slice=True), after
    raise JsonPathError(
        f"error parsing jsonpath {template}: [{inner}] is not supported by kubectl vigil; supported: {SUPPORTED}"
    )


def _bracket_end(text: str, i: int, template: str) -> int:
    quote, depth = "", 0
    for j in range(i + 1, len(text)):
        char = text[j]
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "]" and depth == 0:
            return j
    raise JsonPathError(f"error parsing jsonpath {template}: unclosed array expect ]")


_COMPARISON = re.compile(r"(==|!=|<=|>=|<|>)")


def _filter(expression: str, template: str) -> Filter:
    left, *more = _COMPARISON.split(expression, maxsplit=1)
    left = left.strip()
    if not left.startswith("@"):
        raise JsonPathError(f'error parsing jsonpath {template}: a filter tests a path from @, as ?(@.type=="x")')
    steps, rest = _steps(left[1:], template)
    if rest.strip():
        raise JsonPathError(
            f"error parsing jsonpath {template}: the filter ?({expression}) is not supported by kubectl vigil "
            "(one comparison of a path with a quoted string or a number)"
        )
    path = Path(False, tuple(steps))
    if not more:
        return Filter(path, None)
    op, right = more[0], more[1].strip()
    value: Any
    if right[:1] in "'\"" and len(right) >= 2 and right[-1] == right[0]:
        value = right[1:-1]
    elif _NUMBER.fullmatch(right):
        value = float(right) if "." in right else int(right)
    else:
        raise JsonPathError(
            f"error parsing jsonpath {template}: in ?({expression}), compare with a quoted string or a number"
        )
    return Filter(path, op, value)


# --- the template applied ----------------------------------------------------------------------


def execute(template: str | tuple[Node, ...], data: Any) -> str:
    """The template's text for `data` (a decoded JSON document), as kubectl prints it."""
    nodes = parse(template) if isinstance(template, str) else template
    return "".join(_render(nodes, data, data))


def _render(nodes: tuple[Node, ...], current: Any, root: Any) -> Iterator[str]:
    for node in nodes:
        if isinstance(node, Text):
            yield node.text
        elif isinstance(node, Range):
            for item in find(node.path, current, root):
                yield from _render(node.body, item, root)
        else:
            yield " ".join(text(value) for value in find(node, current, root))


def text(value: Any) -> str:
    """One result as kubectl prints it: a string as is, a map or a list as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def find(path: Path, current: Any, root: Any = None) -> list[Any]:
    """Every value the path reaches, in document order; none is not an error (a missing key)."""
    values = [root if path.root else current]
    for step in path.steps:
        values = [found for value in values for found in _step(step, value, root)]
    return [value for value in values if value is not None]


def _step(step: Field | Wildcard | Descend | Index | Filter, value: Any, root: Any) -> list[Any]:
    if isinstance(step, Field):
        return [value[step.name]] if isinstance(value, dict) and step.name in value else []
    if isinstance(step, Wildcard):
        return list(value.values()) if isinstance(value, dict) else list(value) if isinstance(value, list) else []
    if isinstance(step, Descend):
        return list(_descend(step.name, value))
    if isinstance(step, Index):
        if not isinstance(value, list):
            return []
        if not step.slice:
            assert step.start is not None
            return [value[step.start]] if -len(value) <= step.start < len(value) else []
        return value[step.start : step.end : step.step]
    items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    return [item for item in items if _matches(step, item, root)]


def _descend(name: str, value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        if name in value:
            yield value[name]
        for child in value.values():
            yield from _descend(name, child)
    elif isinstance(value, list):
        for child in value:
            yield from _descend(name, child)


def _matches(step: Filter, item: Any, root: Any) -> bool:
    found = find(step.path, item, root)
    if step.op is None:
        return bool(found)
    if not found:
        return False
    left, right = found[0], step.value
    if step.op in ("==", "!="):
        equal = left == right and isinstance(left, str) == isinstance(right, str)
        return equal if step.op == "==" else not equal
    numbers = isinstance(left, (int, float)) and not isinstance(left, bool) and isinstance(right, (int, float))
    if not numbers and not (isinstance(left, str) and isinstance(right, str)):
        return False  # an order between a number and a string, or a map: none holds
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[step.op]
