"""The base of the API's models: camelCase on the wire, immutable, each validation rule stated
twice (CEL for the API server, Python for the core), the field helpers the models share, and
metav1.Condition, which both kinds' status hold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from vigil.api.names import MAX_CONDITION_MESSAGE, MAX_SECONDS, ConditionStatus


@dataclass(frozen=True)
class Rule:
    """One validation rule, stated twice: in CEL for the API server, in Python for the core.

    Both sides carry the same message, so a person sees the same text whichever refuses. A
    rule that can name the offending values says it twice as well: `message_expression` in CEL
    and `explain` in Python (`message` stays as the API server's fallback).
    """

    cel: str
    message: str
    holds: Callable[[Any], bool]
    message_expression: str | None = None
    explain: Callable[[Any], str] | None = None
    # False for a rule added after objects were stored under the looser one: the API server
    # refuses new values (and, ratcheting, lets an update that leaves the field alone pass), while
    # the core still reads the stored objects and enforces the rule its own way.
    on_read: bool = True

    def as_validation(self) -> dict[str, str]:
        """The rule as an entry of x-kubernetes-validations."""
        entry = {"rule": self.cel, "message": self.message}
        if self.message_expression:
            entry["messageExpression"] = self.message_expression
        return entry


class WireModel(BaseModel):
    """Base of every API model: camelCase on the wire, immutable, validated by `cel_rules`."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)
    cel_rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_cel_rules(self) -> Self:
        for rule in self.cel_rules:
            if rule.on_read and not rule.holds(self):
                raise ValueError(rule.explain(self) if rule.explain else rule.message)
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = handler(core_schema)
        if cls.cel_rules:
            handler.resolve_ref_schema(schema)["x-kubernetes-validations"] = [
                rule.as_validation() for rule in cls.cel_rules
            ]
        return schema


def cel_string(text: str) -> str:
    """`text` as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def seconds_field(default: int | None, *, ge: int, description: str) -> Any:
    """A duration in whole seconds, from `ge` up to MAX_SECONDS."""
    return Field(default, ge=ge, le=MAX_SECONDS, description=f"{description} At most {MAX_SECONDS} (10 years).")


def nested_field(model: type[WireModel], description: str) -> Any:
    """A sub-object that may be left out: the API server then fills it in with all its defaults."""
    # The default is spelled out whole: the API server checks a default against the CEL rules
    # without first filling in the defaults nested inside it, so `{}` would fail them.
    default = model().model_dump(by_alias=True, mode="json", exclude_none=True)  # unset stays unset
    return Field(default_factory=model, description=description, json_schema_extra={"default": default})


class Condition(WireModel):
    """metav1.Condition."""

    type: str = Field(max_length=316, description="The condition's type, in CamelCase, e.g. Succeeded.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="Why, in CamelCase, for machines.",
    )
    message: str = Field(max_length=MAX_CONDITION_MESSAGE, description="Why, for a person.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        None, ge=0, description="The metadata.generation the condition was set for."
    )
