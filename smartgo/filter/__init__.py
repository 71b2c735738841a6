"""Message filters (smartgo.filter): the expression types (RocketMQ's ExpressionType) and SQL92
selectors, shared by the broker, which filters, and the client, which checks at subscribe()."""

from smartgo.filter.sql92 import Selector, SelectorError, compile_selector

TAG = "TAG"
SQL92 = "SQL92"


def is_tag_type(expression_type: str | None) -> bool:
    """ExpressionType.isTagType: no type at all means TAG."""
    return not expression_type or expression_type == TAG


__all__ = ["SQL92", "TAG", "Selector", "SelectorError", "compile_selector", "is_tag_type"]
